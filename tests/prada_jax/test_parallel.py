"""Mesh helpers on 8 simulated CPU devices (subprocess: the device count is fixed at JAX start)."""
import os
import subprocess
import sys
import textwrap

import pytest

# the session's XLA flags (tests/conftest.py) are kept; the device count is added
_EIGHT = {"XLA_FLAGS": (os.environ.get("XLA_FLAGS", "")
                        + " --xla_force_host_platform_device_count=8").strip(),
          "JAX_PLATFORMS": "cpu"}


def _run(code: str, env_extra: dict, timeout: int = 240) -> str:
    env = {**os.environ, **env_extra}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, timeout=timeout,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


_GRADIENT = """
    import jax, jax.numpy as jnp, numpy as np
    from prada_jax import parallel
    assert len(jax.devices()) == 8
    mesh = parallel.make_mesh(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 5)).astype(np.float32)
    y = rng.normal(size=(64,)).astype(np.float32)
    w = rng.normal(size=(5,)).astype(np.float32)
    loss = lambda w, x, y: jnp.mean((x @ w - y) ** 2)
    g = jax.jit(jax.grad(loss))
    ref = np.asarray(g(w, x, y))
    xs, ys = parallel.shard_batch((x, y), mesh)
    got = g(parallel.replicate(w, mesh), xs, ys)
    assert len(xs.sharding.device_set) == 8
    np.testing.assert_allclose(np.asarray(got), ref, rtol=1e-5, atol=1e-6)
    # a direct NumPy gradient as the independent reference
    np.testing.assert_allclose(ref, 2 * x.T @ (x @ w - y) / 64, rtol=1e-4, atol=1e-5)
    print("GRADIENT-OK")
"""

_DEVICE_COUNT = """
    from prada_jax import parallel
    try:
        parallel.make_mesh(16)
    except ValueError as e:
        print("ERR", e)
    m = parallel.make_mesh(4)
    try:
        parallel.check_divisible(10, m, "config.num_envs")
    except ValueError as e:
        print("ERR", e)
"""


@pytest.fixture(scope="module")
def eight_devices() -> str:
    """stdout of one 8-device interpreter running both checks (start-up paid once); a check
    that raises prints NAME-FAILED and its traceback, the other still runs."""
    code = "import sys, textwrap, traceback\n"
    for name, snippet in (("GRADIENT", _GRADIENT), ("DEVICE_COUNT", _DEVICE_COUNT)):
        code += textwrap.dedent(f"""
            try:
                exec(compile(textwrap.dedent({snippet!r}), {name!r}, "exec"), {{}})
            except BaseException:
                print({name!r} + "-FAILED")
                traceback.print_exc(file=sys.stdout)
        """)
    return _run(code, _EIGHT)


def test_sharded_gradient_equals_single_device(eight_devices):
    assert "GRADIENT-OK" in eight_devices, eight_devices[-3000:]


def test_bad_device_count_is_named(eight_devices):
    assert "config.mesh.num_devices=16" in eight_devices, eight_devices[-3000:]
    assert "config.num_envs=10" in eight_devices


@pytest.mark.slow
def test_two_process_distributed_on_localhost(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = textwrap.dedent(f"""
        import sys, jax, jax.numpy as jnp, numpy as np
        from prada_jax import parallel
        cfg = parallel.mesh_config()
        cfg.distributed = True
        cfg.coordinator_address = "127.0.0.1:{port}"
        cfg.num_processes = 2
        cfg.process_id = int(sys.argv[1])
        parallel.maybe_initialize_distributed(cfg)
        assert jax.process_count() == 2 and len(jax.devices()) == 4
        mesh = parallel.make_mesh(0)
        local = np.arange(4, dtype=np.float32) + 4 * jax.process_index()
        x = jax.make_array_from_process_local_data(parallel.batch_sharding(mesh), local)
        total = jax.jit(jnp.sum, out_shardings=parallel.replicated_sharding(mesh))(x)
        print("SUM", float(parallel.host_value(total)))
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
           "JAX_PLATFORMS": "cpu"}
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(2)]
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (o, e) in zip(procs, outs):
        assert p.returncode == 0, e[-3000:]
        assert "SUM 28.0" in o  # 0 + 1 + ... + 7
