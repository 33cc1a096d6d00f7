"""EnvPool's Ray backend on a local cluster: same observations as the process backend, and a killed
actor fails only its own episodes (recorded as server_crashed) while the others go on."""

import time

import pytest

ray = pytest.importorskip("ray")

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec  # noqa: E402

CAT = Catalog.default(kinds=("builtin",))
SPECS = [EpisodeSpec(("notes", "tickets"), seed=3), EpisodeSpec(("shop",), seed=5)]
CALLS = [(0, "list_notes", {}), (0, "create_note", {"title": "Ray plan", "body": "actors"}),
         (0, "list_tickets", {}), (1, "search_products", {"query": "lamp"}), (1, "view_cart", {}),
         (0, "get_note", {"note_id": "nt_9999"}), (1, "add_to_cart", {"sku": 7})]


@pytest.fixture(scope="module")
def cluster():
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    if started:
        ray.shutdown()


def _trace(pool):
    eps = pool.reset(SPECS)
    out = []
    for i, name, args in CALLS:
        o = pool.step([(eps[i], name, args)])[0]
        out.append((o.status, o.content))
    out.append(pool.read_state(eps[0]))
    pool.close(eps)
    return out


def test_ray_backend_equals_process_backend(cluster):
    with EnvPool(CAT, num_workers=2) as pool:
        want = _trace(pool)
    with EnvPool(CAT, num_workers=2, backend="ray") as pool:
        got = _trace(pool)
    assert [s for s, _ in want[:-1]] == ["ok", "ok", "ok", "ok", "ok", "tool_error", "invalid_call"]
    assert got == want


@pytest.mark.slow
def test_killed_actor_fails_only_its_episodes(cluster):
    with EnvPool(CAT, num_workers=2, backend="ray") as pool:
        a, b = pool.reset([EpisodeSpec(("notes",), seed=1), EpisodeSpec(("notes",), seed=2)])
        assert a.worker != b.worker
        assert pool.step([(a, "list_notes", {}), (b, "list_notes", {})])[0].status == "ok"
        pool._ray[0].kill(a.worker)
        obs = pool.step([(a, "list_notes", {}), (b, "list_notes", {})])
        assert obs[0].status == "server_crashed" and obs[1].status == "ok"
        assert pool.is_failed(a) and not pool.is_failed(b)
        # Ray restarts the actor: new episodes on that worker work again.
        deadline = time.time() + 60
        while True:
            (c,) = pool.reset([EpisodeSpec(("notes",), seed=1)])
            if not pool.is_failed(c):
                break
            assert time.time() < deadline, "the killed actor did not come back"
            time.sleep(1)
        assert pool.step([(c, "list_notes", {})])[0].status == "ok"


def test_ray_backend_rejects_bad_settings():
    with pytest.raises(ValueError, match="backend"):
        EnvPool(CAT, backend="threads")
    with pytest.raises(ValueError, match="num_workers"):
        EnvPool(CAT, num_workers=0, backend="ray")
