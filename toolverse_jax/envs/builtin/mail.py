"""Built-in mail server: inbox/folders, send, reply, forward, search (seeded inbox)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, delete_row, get_row, next_id


class Email(TypedDict):
    email_id: str
    sender: str
    to: list[str]
    cc: list[str]
    subject: str
    body: str
    date: str
    folder: str
    read: bool
    thread_id: str


class EmailSummary(TypedDict):
    email_id: str
    sender: str
    subject: str
    date: str
    read: bool


class EmailList(TypedDict):
    emails: list[EmailSummary]
    count: int


class FolderList(TypedDict):
    folders: list[str]


class Deleted(TypedDict):
    email_id: str
    deleted: bool


def _init(rng, seed, sandbox):
    ppl = fixtures.people(seed)
    emails = {}
    for i in range(12):
        p = rng.choice(ppl)
        eid = f"em_{i + 1:04d}"
        emails[eid] = {"email_id": eid, "sender": p["email"], "to": [fixtures.USER["email"]], "cc": [],
                       "subject": rng.choice(fixtures.SUBJECTS).format(n=rng.randint(100, 999)),
                       "body": f"Hi Alex,\n\nPlease see the details about this. Best, {p['name'].split()[0]}",
                       "date": fixtures.day(-rng.randint(0, 20)), "folder": "inbox", "read": rng.random() < 0.4,
                       "thread_id": f"th_{i + 1:04d}"}
    return {"emails": emails, "folders": ["inbox", "archive", "sent", "trash"],
            "_counters": {"em": 12, "th": 12}}


DOMAIN = Domain("mail", "Email account of alex.morgan@example.com: read, search, send, organize.", _init)


def _summary(e: dict) -> EmailSummary:
    return {k: e[k] for k in ("email_id", "sender", "subject", "date", "read")}


def _new(to: list[str], subject: str, body: str, cc: list[str], thread_id: str | None) -> Email:
    for addr in to + cc:
        if "@" not in addr:
            fail(f"recipient {addr!r} is not an email address (expected name@domain)")
    if not to:
        fail("'to' needs at least one recipient")
    eid = next_id("em")
    e = {"email_id": eid, "sender": fixtures.USER["email"], "to": to, "cc": cc, "subject": subject,
         "body": body, "date": fixtures.day(0), "folder": "sent", "read": True,
         "thread_id": thread_id or next_id("th")}
    db()["emails"][eid] = e
    return clone(e)


@DOMAIN.tool
def list_emails(folder: str = "inbox", unread_only: bool = False, limit: int = 20) -> EmailList:
    """List emails in a folder (newest first)."""
    if folder not in db()["folders"]:
        fail(f"folder {folder!r} does not exist; folders: {db()['folders']}")
    rows = [e for e in db()["emails"].values() if e["folder"] == folder and (not unread_only or not e["read"])]
    rows.sort(key=lambda e: (e["date"], e["email_id"]), reverse=True)
    out = [_summary(e) for e in rows[: max(0, limit)]]
    return {"emails": out, "count": len(out)}


@DOMAIN.tool
def read_email(email_id: str) -> Email:
    """Read one email by id (marks it read)."""
    e = get_row("emails", email_id, "email")
    e["read"] = True
    return clone(e)


@DOMAIN.tool
def send_email(to: list[str], subject: str, body: str, cc: list[str] = []) -> Email:
    """Send a new email; returns the sent message."""
    return _new(list(to), subject, body, list(cc), None)


@DOMAIN.tool
def reply_email(email_id: str, body: str) -> Email:
    """Reply to the sender of an email, in the same thread."""
    e = get_row("emails", email_id, "email")
    return _new([e["sender"]], "Re: " + e["subject"], body, [], e["thread_id"])


@DOMAIN.tool
def forward_email(email_id: str, to: list[str], note: str = "") -> Email:
    """Forward an email to other recipients."""
    e = get_row("emails", email_id, "email")
    return _new(list(to), "Fwd: " + e["subject"], note + "\n\n> " + e["body"], [], e["thread_id"])


@DOMAIN.tool
def search_emails(query: str, limit: int = 20) -> EmailList:
    """Search emails by sender, subject or body (case-insensitive substring)."""
    q = query.lower()
    rows = [e for e in db()["emails"].values()
            if q in e["sender"].lower() or q in e["subject"].lower() or q in e["body"].lower()]
    out = [_summary(e) for e in rows[: max(0, limit)]]
    return {"emails": out, "count": len(out)}


@DOMAIN.tool
def move_email(email_id: str, folder: str) -> Email:
    """Move an email to another folder."""
    if folder not in db()["folders"]:
        fail(f"folder {folder!r} does not exist; folders: {db()['folders']}")
    e = get_row("emails", email_id, "email")
    e["folder"] = folder
    return clone(e)


@DOMAIN.tool
def mark_email(email_id: str, read: bool = True) -> Email:
    """Mark an email read or unread."""
    e = get_row("emails", email_id, "email")
    e["read"] = read
    return clone(e)


@DOMAIN.tool
def delete_email(email_id: str) -> Deleted:
    """Delete an email permanently."""
    return delete_row("emails", email_id, "email")


@DOMAIN.tool
def list_folders() -> FolderList:
    """List mail folders."""
    return {"folders": list(db()["folders"])}
