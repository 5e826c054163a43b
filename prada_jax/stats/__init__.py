"""The project's one statistics module: every confidence interval, paired difference,
bootstrap, cluster t, minimum detectable effect (MDE) and variance component that an
evaluation or a study reports. NumPy only (SciPy checks the tests).

Submodules (each name below is re-exported here):

* :mod:`~prada_jax.stats.tdist`: Student's t (``t_cdf``, ``t_ppf``, ``betainc_regularized``);
* :mod:`~prada_jax.stats.intervals`: Student-t intervals over seeds (``mean_ci`` → ``MeanCI``,
  ``paired_diff_ci``, ``paired_ratio_ci``), the decision rules read off an interval
  (``noninferior``, ``superior``), ``finite_or_none`` and ``find_knee``;
* :mod:`~prada_jax.stats.power`: MDEs (``min_detectable_effect``, ``paired_mde``,
  ``mde_of_differences``) and the seed / problem / interaction variance components of a paired
  difference with the MDE they plan (``variance_components``, ``planned_mde``,
  ``problems_for_mde``);
* :mod:`~prada_jax.stats.bootstrap`: the two-way (seeds × problems) bootstrap of a paired
  difference and of a ratio, the cluster bootstrap of per-group means, plain row resampling and
  percentile intervals;
* :mod:`~prada_jax.stats.hierarchical`: the nested bootstrap (policies → learner seeds →
  evaluation seeds) and the cluster t over policy means of a pooled verdict.
"""
from prada_jax.stats.tdist import betainc_regularized, t_cdf, t_ppf
from prada_jax.stats.intervals import (MeanCI, finite_or_none, find_knee, mean_ci, noninferior,
                                       paired_diff_ci, paired_ratio_ci, superior)
from prada_jax.stats.power import (BOOTSTRAP_INTERACTION, Z_ALPHA, Z_POWER, mde_of_differences,
                                   min_detectable_effect, paired_mde, planned_mde,
                                   problems_for_mde, variance_components)
from prada_jax.stats.bootstrap import (cluster_group_means, explicit_replicate,
                                       multinomial_counts, percentile_interval,
                                       resample_indices, tail_percents, two_way_bootstrap,
                                       two_way_counts, two_way_ratio_bootstrap)
from prada_jax.stats.hierarchical import (DEFAULT_RESAMPLES as HIERARCHICAL_RESAMPLES,
                                          bootstrap_variance, cell_means, cluster_t,
                                          grand_mean, hierarchical_bootstrap, hierarchical_draws,
                                          policy_means, policy_means_mde)
from prada_jax.stats.hierarchical import interval as hierarchical_interval

__all__ = [
    "betainc_regularized", "t_cdf", "t_ppf",
    "MeanCI", "finite_or_none", "find_knee", "mean_ci", "noninferior", "paired_diff_ci",
    "paired_ratio_ci", "superior",
    "BOOTSTRAP_INTERACTION", "Z_ALPHA", "Z_POWER", "mde_of_differences", "min_detectable_effect",
    "paired_mde", "planned_mde", "problems_for_mde", "variance_components",
    "cluster_group_means", "explicit_replicate", "multinomial_counts", "percentile_interval",
    "resample_indices", "tail_percents", "two_way_bootstrap", "two_way_counts",
    "two_way_ratio_bootstrap",
    "HIERARCHICAL_RESAMPLES", "bootstrap_variance", "cell_means", "cluster_t", "grand_mean",
    "hierarchical_bootstrap", "hierarchical_draws", "hierarchical_interval", "policy_means",
    "policy_means_mde",
]
