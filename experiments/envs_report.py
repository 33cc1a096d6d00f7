"""Prints the environment catalog: `python -m experiments.envs_report [--json] [--kinds builtin,...]`."""

import argparse
import json
import logging


def report(kinds=None) -> dict:
    """Returns {"servers": [{name, kind, num_tools, available, reason}], "num_tools": N (available)}."""
    from toolverse_jax.envs import Catalog

    cat = Catalog.default(kinds=kinds)
    rows = [{"name": e.name, "kind": e.kind, "num_tools": cat.num_tools(e.name), "available": e.available,
             "reason": e.reason} for e in cat.servers]
    return {"servers": rows, "num_servers": len(rows),
            "num_available": sum(r["available"] for r in rows),
            "num_tools": sum(r["num_tools"] for r in rows if r["available"])}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--json", action="store_true")
    p.add_argument("--kinds", default="", help="comma-separated subset of builtin,synthesized,third_party")
    a = p.parse_args(argv)
    logging.getLogger("toolverse_jax.envs.catalog").setLevel(logging.ERROR)
    r = report(tuple(k for k in a.kinds.split(",") if k) or None)
    if a.json:
        print(json.dumps(r))
        return
    print(f"{'server':<24} {'kind':<12} {'tools':>5}  available")
    for s in r["servers"]:
        print(f"{s['name']:<24} {s['kind']:<12} {s['num_tools']:>5}  {'yes' if s['available'] else 'no: ' + s['reason']}")
    by_kind = {}
    for s in r["servers"]:
        k = by_kind.setdefault(s["kind"], [0, 0])
        k[0] += 1
        k[1] += s["num_tools"] if s["available"] else 0
    print("-" * 56)
    for k, (n, t) in sorted(by_kind.items()):
        print(f"{k:<24} {n:>4} servers {t:>6} tools")
    print(f"{'total':<24} {r['num_servers']:>4} servers {r['num_tools']:>6} tools "
          f"({r['num_available']} available)")


if __name__ == "__main__":
    main()
