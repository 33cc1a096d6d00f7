"""GUST generation on Ray actors (`backend="ray"`, local cluster): the same task set as in one
process, and a generator actor that dies mid-chunk is restarted and its chunk rerun."""

import os

import pytest

ray = pytest.importorskip("ray")

from toolverse_jax.tasks.gust import generate_gust  # noqa: E402

HERE = os.path.dirname(__file__)
ROOT = os.path.dirname(HERE)


def _cfg(**kw):
    base = dict(num_tasks=24, horizons=(2, 3, 4), num_servers=(1, 3),
                executor_factory="tasks_fake:make_fake_executor", chunk_size=6, num_processes=0)
    base.update(kw)
    return base


@pytest.fixture(scope="module")
def cluster():
    started = not ray.is_initialized()
    if started:  # actors import tests/tasks_fake.py: put tests/ on their path
        path = os.pathsep.join([HERE, ROOT, os.environ.get("PYTHONPATH", "")])
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    if started:
        ray.shutdown()


def test_generator_actor_body_in_process_gives_the_same_set():
    """The actor's body without Ray (fast): GustGenerator chunks fed by gust.feed_chunks."""
    from toolverse_jax.tasks import gust
    from toolverse_jax.tasks.ray_gen import GustGenerator

    want, _ = generate_gust(_cfg(), progress=False)
    s = gust._settings(_cfg())
    gen = GustGenerator(s)
    got = []

    def consume(rows):
        got.extend(tj for _, tj, _, _ in rows if tj is not None)
        return len(got) >= 24

    try:
        gust.feed_chunks(s, 2, lambda ch: gen.run(ch), lambda rows: rows, consume)
    finally:
        gen.shutdown()
    assert not os.path.exists(gen.root)
    assert [tj["id"] for tj in got[:24]] == [t.id for t in want]


@pytest.mark.slow  # a local Ray cluster and 2 actors: ~45 s on 2 cores
def test_ray_actors_give_the_same_set_as_one_process(cluster):
    want, _ = generate_gust(_cfg(), progress=False)
    got, man = generate_gust(_cfg(backend="ray", num_processes=2), progress=False)
    assert [t.id for t in got] == [t.id for t in want]
    assert [t.to_json() for t in got] == [t.to_json() for t in want]
    assert man["num_tasks"] == 24 and man["startup_s"] > 0


def test_unknown_backend_is_named():
    with pytest.raises(ValueError, match="backend='dask'"):
        generate_gust(_cfg(backend="dask"), progress=False)


@pytest.mark.slow
def test_dead_generator_is_restarted_and_its_chunk_rerun(cluster, tmp_path):
    marker = str(tmp_path / "died_once")
    os.environ["TOOLVERSE_TEST_DIE_ONCE"] = marker  # read by tasks_fake.make_dying_executor
    try:
        want, _ = generate_gust(_cfg(num_tasks=8), progress=False)
        got, _ = generate_gust(
            _cfg(num_tasks=8, backend="ray", num_processes=1,
                 executor_factory="tasks_fake:make_dying_executor",
                 ray_options={"runtime_env": {"env_vars": {
                     "TOOLVERSE_TEST_DIE_ONCE": marker,
                     "PYTHONPATH": os.pathsep.join([HERE, ROOT])}}}),
            progress=False)
    finally:
        os.environ.pop("TOOLVERSE_TEST_DIE_ONCE", None)
    assert os.path.exists(marker)  # the first actor did die
    assert [t.to_json() for t in got] == [t.to_json() for t in want]
