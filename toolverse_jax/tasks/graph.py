"""Tool dependency graph: which tool's outputs can fill which tool's inputs (DESIGN §4).

Nodes are tools, keyed `"server.tool"`, with attributes `server`, `tool`, `spec`, `kind`
(create/get/list/search/update/delete/action), `entity`, `outputs` (scalar output fields) and
`params` (top-level input parameters). A `MultiDiGraph` edge `u -> v` is either

- a value edge (`kind="value"`, labelled `field` = output path of `u`, `param` = required input of
  `v`, `score`, `source` = "schema" | "observed"), or
- a must-follow edge (`kind="order"`), e.g. `login` before `transfer`, from rules.

Cross-server edges (contacts' `email` -> mail's `to`) are ordinary edges.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Iterable, Sequence

import networkx as nx

from toolverse_jax.tasks import schema as sch

# (predecessor regex, successor regex) on tool names, applied within one server.
DEFAULT_ORDER_RULES: tuple[tuple[str, str], ...] = (
    (r"^(login|log_in|sign_in|authenticate)$", r"^(transfer|pay|withdraw|deposit|send_money)"),
)
MIN_SCORE = 0.5


def node_id(server: str, tool: str) -> str:
    """Returns the graph node id of a tool."""
    return f"{server}.{tool}"


def _tool_attrs(server: str, spec: dict) -> dict:
    entity = sch.tool_entity(spec["name"])
    return {
        "server": server,
        "tool": spec["name"],
        "spec": spec,
        "kind": sch.tool_kind(spec["name"]),
        "entity": entity,
        "outputs": sch.schema_fields(spec.get("outputSchema"), entity),
        "params": sch.input_params(spec),
        "has_output_schema": bool(spec.get("outputSchema")),
    }


_LINK_KEYS = {"email", "phone", "city", "amount", "date", "datetime", "quantity"}


def linkable(p: dict) -> bool:
    """Returns whether a parameter is filled by value flow (ids, emails, names, ...) rather than
    stated by the user (free text, enums, flags)."""
    if p["type"] == "boolean" or any("enum" in a for a in sch.alternatives(p["schema"])):
        return False
    words = sch.split_words(p["name"])
    if p["key"].startswith(("id:", "name:")) or p["key"] in _LINK_KEYS:
        return True
    if set(words) & (sch.FREE_TEXT | sch.STATED) or p["type"] in ("object", "array"):
        return False
    return True


def _value_edges(g: nx.MultiDiGraph, u: str, fields: Sequence[dict], source: str,
                 values: dict[str, list] | None = None) -> int:
    """Adds value edges from `u`'s fields to every required param they can fill; returns count.

    With `values` (observed values per field path), a field feeds a param only if one of its
    values validates against the param's schema.
    """
    added = 0
    for v, vd in g.nodes(data=True):
        if v == u:
            continue
        for p in vd["params"]:
            if not p["required"] or not linkable(p):
                continue
            scored = []
            for f in fields:
                if not sch.types_compatible(f["type"], p["type"]):
                    continue
                s = sch.keys_match(f["key"], p["key"], f["path"], p["name"])
                if s >= MIN_SCORE and values is not None and not any(
                        sch.validates(x, p["schema"]) for x in values.get(f["path"], [])[:50]):
                    continue
                if s >= MIN_SCORE:
                    scored.append((s, f))
            if not scored:
                continue
            best = max(s for s, _ in scored)
            for s, f in scored:
                if s < best:
                    continue
                key = f"{f['path']}->{p['name']}"
                if g.has_edge(u, v, key):
                    continue
                g.add_edge(u, v, key=key, kind="value", field=f["path"], param=p["name"],
                           score=s, source=source)
                added += 1
    return added


def _speculative_fields(attrs: dict) -> list[dict]:
    """Returns guessed output fields for a tool without an outputSchema (`**.id` of its entity)."""
    if attrs["has_output_schema"] or attrs["kind"] in ("delete",):
        return []
    ent = attrs["entity"]
    return [{"path": "**.id", "type": "string", "format": None, "key": f"id:{ent}",
             "entity": ent}]


def build_tool_graph(tool_specs: Iterable[tuple[str, dict]],
                     rules: Sequence[tuple[str, str]] = DEFAULT_ORDER_RULES) -> nx.MultiDiGraph:
    """Returns the tool dependency graph of `(server, MCP tool spec)` pairs.

    Args:
      tool_specs: `(server, spec)` with spec as `tools/list` returns it (name, description,
        inputSchema, optional outputSchema).
      rules: must-follow rules `(pred_regex, succ_regex)` on tool names within one server.
    """
    g = nx.MultiDiGraph()
    for server, spec in tool_specs:
        g.add_node(node_id(server, spec["name"]), **_tool_attrs(server, spec))
    for u, ud in list(g.nodes(data=True)):
        fields = ud["outputs"] or _speculative_fields(ud)
        _value_edges(g, u, fields, "schema" if ud["outputs"] else "guess")
    add_order_rules(g, rules)
    return g


def add_order_rules(g: nx.MultiDiGraph, rules: Sequence[tuple[str, str]]) -> int:
    """Adds must-follow edges for every rule match within a server; returns how many."""
    added = 0
    by_server: dict[str, list[str]] = defaultdict(list)
    for n, d in g.nodes(data=True):
        by_server[d["server"]].append(n)
    for pred_re, succ_re in rules:
        for nodes in by_server.values():
            preds = [n for n in nodes if re.search(pred_re, g.nodes[n]["tool"])]
            succs = [n for n in nodes if re.search(succ_re, g.nodes[n]["tool"])]
            for u in preds:
                for v in succs:
                    if u != v and not g.has_edge(u, v, "order"):
                        g.add_edge(u, v, key="order", kind="order", field=None, param=None,
                                   score=1.0, source="rule")
                        added += 1
    return added


def refine_with_observations(g: nx.MultiDiGraph, observations: Iterable[dict],
                             ) -> dict[str, int]:
    """Refines value edges with executions; returns {"dropped": n, "added": n}.

    Each observation is `{"node": "server.tool", "output": JSON, "arguments": dict?,
    "status": "ok"?}`, in execution order. For every producer with outputs:
    - a value edge is dropped when the values it produced at `field` never validate against the
      consumer's parameter schema (or the field never appears);
    - observed output fields not in the schema get edges by the usual matching;
    - an edge is added (`source="observed"`) when an `ok` call's argument equals a value an
      earlier call produced, i.e. the flow was seen to work.
    """
    obs = [o for o in observations if o.get("node") in g]
    outputs: dict[str, list[Any]] = defaultdict(list)
    for o in obs:
        if o.get("status", "ok") == "ok" and o.get("output") is not None:
            outputs[o["node"]].append(o["output"])
    dropped = added = 0
    for u, outs in outputs.items():
        ud = g.nodes[u]
        seen_fields = {f["path"]: f for out in outs for f in sch.value_fields(out, ud["entity"])}
        for _, v, k, d in list(g.out_edges(u, keys=True, data=True)):
            if d["kind"] != "value" or d["source"] == "observed":
                continue
            values = [x for out in outs for x in _field_values(out, d["field"])]
            p = next(p for p in g.nodes[v]["params"] if p["name"] == d["param"])
            if not values or not any(sch.validates(x, p["schema"]) for x in values[:50]):
                g.remove_edge(u, v, k)
                dropped += 1
        new = [f for path, f in seen_fields.items()
               if all(path != o["path"] for o in ud["outputs"])]
        if new:
            before = g.number_of_edges()
            vals = {f["path"]: [x for out in outs for x in sch.extract(out, f["path"])]
                    for f in new}
            _value_edges(g, u, new, "observed", vals)
            added += g.number_of_edges() - before
    # Flows seen to work: an argument value that an earlier call produced.
    produced: list[tuple[str, str, Any]] = []
    for o in obs:
        if o.get("status", "ok") == "ok" and o.get("arguments"):
            for pname, val in o["arguments"].items():
                if isinstance(val, (dict, list)) or val is None:
                    continue
                for u, path, pv in reversed(produced):
                    if u != o["node"] and pv == val:
                        key = f"{path}->{pname}"
                        if not g.has_edge(u, o["node"], key):
                            g.add_edge(u, o["node"], key=key, kind="value", field=path,
                                       param=pname, score=1.0, source="observed")
                            added += 1
                        break
        if o.get("status", "ok") == "ok" and o.get("output") is not None:
            ent = g.nodes[o["node"]]["entity"]
            for f in sch.value_fields(o["output"], ent):
                for x in sch.extract(o["output"], f["path"])[:20]:
                    produced.append((o["node"], f["path"], x))
    return {"dropped": dropped, "added": added}


def _field_values(value: Any, path: str) -> list[Any]:
    if path.startswith("**."):
        leaf = path[3:]
        return [r[leaf] for _, r in sch.iter_records(value) if leaf in r
                and not isinstance(r[leaf], (dict, list))]
    return sch.extract(value, path)


field_values = _field_values


def subgraph_for_servers(g: nx.MultiDiGraph, servers: Iterable[str]) -> nx.MultiDiGraph:
    """Returns the induced subgraph of the tools of `servers` (a view)."""
    servers = set(servers)
    return g.subgraph([n for n, d in g.nodes(data=True) if d["server"] in servers])


def tools_unlocked_by(g: nx.MultiDiGraph, executed: Iterable[str] = (),
                      value_keys: Iterable[str] = ()) -> set[str]:
    """Returns the tools whose every required param can be filled, and whose must-follow
    predecessors ran, given executed tools and extra available semantic keys (e.g. `id:order`
    from the environment state)."""
    executed, keys = set(executed), set(value_keys)
    out = set()
    for v, vd in g.nodes(data=True):
        if any(d["kind"] == "order" and u not in executed
               for u, _, d in g.in_edges(v, data=True)):
            continue
        fed = {d["param"] for u, _, d in g.in_edges(v, data=True)
               if d["kind"] == "value" and u in executed}
        if all(p["name"] in fed or p["key"] in keys for p in vd["params"] if p["required"]):
            out.add(v)
    return out


def longest_dependency_paths(g: nx.MultiDiGraph, k: int = 5) -> list[list[str]]:
    """Returns up to `k` longest dependency chains (lists of tools), longest first.

    Cycles are broken by condensing strongly connected components; one representative tool per
    component stands on the chain.
    """
    simple = nx.DiGraph(g)
    simple.remove_edges_from(nx.selfloop_edges(simple))
    cond = nx.condensation(simple)
    members = cond.graph["mapping"]
    inv: dict[int, list[str]] = defaultdict(list)
    for n, c in members.items():
        inv[c].append(n)
    # Longest path ending at each component, by DP in topological order.
    best: dict[int, tuple[int, int | None]] = {}
    for c in nx.topological_sort(cond):
        preds = [(best[p][0], p) for p in cond.predecessors(c)]
        best[c] = (max(preds)[0] + 1, max(preds)[1]) if preds else (1, None)
    ends = sorted(best, key=lambda c: (-best[c][0], c))
    paths = []
    for end in ends:
        if len(paths) >= k:
            break
        chain, c = [], end
        while c is not None:
            chain.append(c)
            c = best[c][1]
        chain.reverse()
        tools = [sorted(inv[chain[0]])[0]]
        for c in chain[1:]:
            cand = [n for n in sorted(inv[c]) if simple.has_edge(tools[-1], n)]
            tools.append(cand[0] if cand else sorted(inv[c])[0])
        if tools not in paths and not any(tools == p[-len(tools):] for p in paths):
            paths.append(tools)
    return paths


def graph_stats(g: nx.MultiDiGraph) -> dict:
    """Returns summary statistics of a tool graph (counts, degrees, longest chain)."""
    value = [(u, v) for u, v, d in g.edges(data=True) if d["kind"] == "value"]
    order = [(u, v) for u, v, d in g.edges(data=True) if d["kind"] == "order"]
    servers = {d["server"] for _, d in g.nodes(data=True)}
    cross = [(u, v) for u, v in value if g.nodes[u]["server"] != g.nodes[v]["server"]]
    n = max(g.number_of_nodes(), 1)
    longest = longest_dependency_paths(g, k=1)
    return {
        "num_tools": g.number_of_nodes(),
        "num_servers": len(servers),
        "num_edges": g.number_of_edges(),
        "value_edges": len(value),
        "order_edges": len(order),
        "cross_server_edges": len(cross),
        "cross_server_pairs": len({(g.nodes[u]["server"], g.nodes[v]["server"])
                                   for u, v in cross}),
        "mean_out_degree": round(g.number_of_edges() / n, 3),
        "sources": sum(1 for v in g if not any(True for _ in g.predecessors(v))),
        "longest_chain": len(longest[0]) if longest else 0,
    }
