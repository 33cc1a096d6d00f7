"""Built-in support-ticket server: tickets for customers/orders, agents, comments (seeded desk)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, get_row, next_id

STATUSES = ("open", "pending", "resolved", "closed")
PRIORITIES = ("low", "normal", "high", "urgent")


class Comment(TypedDict):
    author: str
    text: str


class Ticket(TypedDict):
    ticket_id: str
    customer_email: str
    subject: str
    description: str
    priority: str
    status: str
    assignee: str
    order_id: str
    comments: list[Comment]
    resolution: str


class TicketList(TypedDict):
    tickets: list[Ticket]
    count: int


class Agent(TypedDict):
    email: str
    name: str
    open_tickets: int


class AgentList(TypedDict):
    agents: list[Agent]


def _init(rng, seed, sandbox):
    ppl = fixtures.people(seed)
    tickets = {}
    for i in range(6):
        tid = f"tk_{i + 1:04d}"
        tickets[tid] = {"ticket_id": tid, "customer_email": rng.choice(ppl)["email"],
                        "subject": rng.choice(["Late delivery", "Wrong item", "Refund status", "Login issue"]),
                        "description": "Customer reported a problem.", "priority": rng.choice(PRIORITIES),
                        "status": rng.choice(STATUSES[:2]), "assignee": "", "order_id": f"ord_{rng.randint(1, 4):04d}",
                        "comments": [], "resolution": ""}
    agents = {"sam@support.example.com": "Sam Reyes", "kim@support.example.com": "Kim Lee"}
    return {"tickets": tickets, "agents": agents, "_counters": {"tk": 6}}


DOMAIN = Domain("tickets", "Customer support desk: create, assign, comment on and resolve tickets.", _init)


def _check(value: str, allowed: tuple, param: str) -> str:
    if value not in allowed:
        fail(f"'{param}' must be one of {list(allowed)}; got {value!r}")
    return value


@DOMAIN.tool
def create_ticket(customer_email: str, subject: str, description: str, priority: str = "normal",
                  order_id: str = "") -> Ticket:
    """Open a support ticket for a customer (optionally about an order)."""
    if "@" not in customer_email:
        fail(f"'customer_email' must look like name@domain; got {customer_email!r}")
    tid = next_id("tk")
    row = {"ticket_id": tid, "customer_email": customer_email, "subject": subject, "description": description,
           "priority": _check(priority, PRIORITIES, "priority"), "status": "open", "assignee": "",
           "order_id": order_id, "comments": [], "resolution": ""}
    db()["tickets"][tid] = row
    return clone(row)


@DOMAIN.tool
def get_ticket(ticket_id: str) -> Ticket:
    """Get a ticket by id."""
    return clone(get_row("tickets", ticket_id, "ticket"))


@DOMAIN.tool
def list_tickets(status: str = "", customer_email: str = "") -> TicketList:
    """List tickets, optionally by status and customer."""
    rows = [t for t in db()["tickets"].values()
            if (not status or t["status"] == status) and (not customer_email or t["customer_email"] == customer_email)]
    return {"tickets": clone(rows), "count": len(rows)}


@DOMAIN.tool
def search_tickets(query: str) -> TicketList:
    """Search tickets by subject or description."""
    q = query.lower()
    rows = [t for t in db()["tickets"].values() if q in t["subject"].lower() or q in t["description"].lower()]
    return {"tickets": clone(rows), "count": len(rows)}


@DOMAIN.tool
def update_ticket_status(ticket_id: str, status: str) -> Ticket:
    """Set a ticket's status (open, pending, resolved, closed)."""
    row = get_row("tickets", ticket_id, "ticket")
    row["status"] = _check(status, STATUSES, "status")
    return clone(row)


@DOMAIN.tool
def set_priority(ticket_id: str, priority: str) -> Ticket:
    """Set a ticket's priority (low, normal, high, urgent)."""
    row = get_row("tickets", ticket_id, "ticket")
    row["priority"] = _check(priority, PRIORITIES, "priority")
    return clone(row)


@DOMAIN.tool
def assign_ticket(ticket_id: str, agent_email: str) -> Ticket:
    """Assign a ticket to a support agent."""
    if agent_email not in db()["agents"]:
        fail(f"agent {agent_email!r} not found; list_agents shows valid ones")
    row = get_row("tickets", ticket_id, "ticket")
    row["assignee"] = agent_email
    return clone(row)


@DOMAIN.tool
def add_comment(ticket_id: str, text: str, author: str = "alex.morgan@example.com") -> Ticket:
    """Add a comment to a ticket."""
    row = get_row("tickets", ticket_id, "ticket")
    row["comments"].append({"author": author, "text": text})
    return clone(row)


@DOMAIN.tool
def close_ticket(ticket_id: str, resolution: str) -> Ticket:
    """Close a ticket with a resolution note."""
    row = get_row("tickets", ticket_id, "ticket")
    row["status"], row["resolution"] = "closed", resolution
    return clone(row)


@DOMAIN.tool
def list_agents() -> AgentList:
    """List support agents with their open ticket counts."""
    ts = db()["tickets"].values()
    return {"agents": [{"email": e, "name": n, "open_tickets": sum(t["assignee"] == e and t["status"] != "closed"
                                                                   for t in ts)} for e, n in db()["agents"].items()]}
