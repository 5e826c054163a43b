"""``evals.grid``'s score of a pair: the mean over its finite seeds, −inf when none is finite,
without NumPy's "Mean of empty slice" warning for such a row (issue 43: the default suite
printed it)."""
import warnings

import numpy as np

from evals import grid


def test_a_pair_without_a_finite_seed_scores_minus_inf_without_a_warning():
    obj = np.array([[np.nan, np.inf, -np.inf],     # every seed over budget / non-finite
                    [0.5, np.nan, 0.25],
                    [0.1, 0.2, 0.3]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = grid._score(obj)
    assert s[0] == -np.inf
    np.testing.assert_array_equal(s[1:], [np.nanmean([0.5, 0.25]), np.mean([0.1, 0.2, 0.3])])
    # the search still prefers the finite pairs and reports the empty one as None (strict JSON)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = grid.search(lambda la, mu: obj[: len(la)], lam=(0.0, 0.1, 0.2), mu_per_mhz=(0.0,),
                        fine=False)
    assert g["best"]["lambda_s"] == 0.1 and [p[2] for p in g["points"]][0] is None
