"""Adversarial arguments (traversal, huge, wrong types, unicode) never escape the sandbox or kill a worker."""

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolverse_jax.envs import Catalog, EnvPool, EpisodeSpec
from toolverse_jax.envs.pool import STATUSES

CAT = Catalog.default()
SERVERS = tuple(s for s in ("filesystem", "git", "sqlite", "mail", "bank", "jira", "memory")
                if s in CAT and CAT.entry(s).available)

_traversal = st.sampled_from(["../../../../outside/pwned", "/etc/passwd", "../" * 12 + "etc/shadow", "~/.ssh/id_rsa",
                              "..", "/", "./../x", "docs/../../../outside/pwned", "\x00", "a\x00b", "C:\\x",
                              "%2e%2e/%2e%2e/etc", "docs/./todo.txt", "README.md"])
_scalar = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.text(max_size=40), _traversal,
                    st.text(alphabet=st.characters(min_codepoint=0x80, max_codepoint=0x10FFFF,
                                                   blacklist_categories=("Cs",)), max_size=20),
                    st.integers(1000, 80000).map(lambda n: "A" * n))
_value = st.recursive(_scalar, lambda c: st.one_of(st.lists(c, max_size=3), st.dictionaries(st.text(max_size=8), c, max_size=3)),
                      max_leaves=6)


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    base = tmp_path_factory.mktemp("fuzz")
    outside = base / "outside"
    outside.mkdir()
    (outside / "canary.txt").write_text("canary")
    with EnvPool(CAT, num_workers=1, call_timeout_s=10.0, root=str(base / "pool")) as pool:
        (ep,) = pool.reset([EpisodeSpec(SERVERS, seed=0)])
        yield pool, ep, outside


def _calls(ep):
    names = sorted(ep.names)

    @st.composite
    def call(draw):
        name = draw(st.sampled_from(names))
        props = [t for t in ep.tools if t["name"] == name][0]["inputSchema"].get("properties", {})
        keys = draw(st.lists(st.sampled_from(sorted(props) or ["x"]) | st.text(max_size=6), max_size=4))
        args = {k: draw(_value) for k in keys}
        if draw(st.booleans()):
            args = draw(st.one_of(_value, st.just(args)))
        return name, args

    return call()


def _run(fuzz_env, n):
    pool, ep, outside = fuzz_env
    seen = {}

    @settings(max_examples=n, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(_calls(ep), min_size=1, max_size=4))
    def check(batch):
        obs = pool.step([(ep, name, args) for name, args in batch])
        for o in obs:
            assert o.status in STATUSES
            assert o.status != "server_crashed", o.content
            seen[o.status] = seen.get(o.status, 0) + 1
        assert sorted(os.listdir(outside)) == ["canary.txt"]

    check()
    assert (outside / "canary.txt").read_text() == "canary"
    assert not pool.is_failed(ep)
    assert pool.step([(ep, "list_folders", {})])[0].status == "ok"
    assert seen.get("invalid_call", 0) > 0
    return seen


def test_fuzz_small(fuzz_env):
    _run(fuzz_env, 120)


@pytest.mark.slow
def test_fuzz_1000(fuzz_env):
    seen = _run(fuzz_env, 1000)
    assert sum(seen.values()) >= 1000
