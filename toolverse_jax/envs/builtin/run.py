"""Serves one built-in domain over stdio: `python -m toolverse_jax.envs.builtin.run mail`.

`--seed`/`--sandbox` set the state of the default episode (for use without the env pool).
"""

import argparse
import importlib

DOMAINS = ("mail", "calendar", "contacts", "bank", "shop", "travel", "notes", "tickets", "faulty",
           "search", "memory_bank", "buttons")


def load_domain(name: str):
    """Returns the Domain object of built-in server `name`."""
    if name not in DOMAINS:
        raise KeyError(f"unknown built-in server {name!r}; known: {', '.join(DOMAINS)}")
    return importlib.import_module(f"toolverse_jax.envs.builtin.{name}").DOMAIN


def build_server(name: str, control_token: str | None = None):
    """Returns a DomainServer (MCPServer) for built-in server `name` (`control_token`: see
    base.EpisodeControl; None reads it from the environment)."""
    from toolverse_jax.envs.builtin.base import DomainServer

    return DomainServer(load_domain(name), control_token)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("domain", choices=DOMAINS)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sandbox", default=None)
    a = p.parse_args(argv)
    server = build_server(a.domain)
    server.episodes.states["default"] = server.domain.fresh_state(a.seed, a.sandbox)
    from toolverse_jax.envs.builtin.base import run_stdio

    run_stdio(server)


if __name__ == "__main__":
    main()
