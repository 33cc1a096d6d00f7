"""Built-in notes/docs server: notes with titles, bodies, tags and sharing (seeded notebook)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, delete_row, get_row, next_id


class Note(TypedDict):
    note_id: str
    title: str
    body: str
    tags: list[str]
    shared_with: list[str]
    updated: str


class NoteList(TypedDict):
    notes: list[Note]
    count: int


class TagList(TypedDict):
    tags: list[str]


class Deleted(TypedDict):
    note_id: str
    deleted: bool


def _init(rng, seed, sandbox):
    notes = {}
    for i, (title, tag) in enumerate([("Meeting notes", "work"), ("Packing list", "travel"),
                                      ("Gift ideas", "personal"), ("Reading list", "personal"),
                                      ("Q2 goals", "work"), ("Recipes", "home")]):
        nid = f"nt_{i + 1:04d}"
        notes[nid] = {"note_id": nid, "title": title, "body": f"{title}: item {rng.randint(1, 99)}",
                      "tags": [tag], "shared_with": [], "updated": fixtures.day(-rng.randint(0, 9))}
    return {"notes": notes, "_counters": {"nt": len(notes)}}


DOMAIN = Domain("notes", "Personal notes and documents: create, edit, tag, search, share.", _init)


@DOMAIN.tool
def create_note(title: str, body: str = "", tags: list[str] = []) -> Note:
    """Create a note."""
    if not title.strip():
        fail("'title' must not be empty")
    nid = next_id("nt")
    row = {"note_id": nid, "title": title, "body": body, "tags": list(tags), "shared_with": [],
           "updated": fixtures.day(0)}
    db()["notes"][nid] = row
    return clone(row)


@DOMAIN.tool
def get_note(note_id: str) -> Note:
    """Get a note by id."""
    return clone(get_row("notes", note_id, "note"))


@DOMAIN.tool
def update_note(note_id: str, title: str = "", body: str = "") -> Note:
    """Replace a note's title and/or body (empty strings leave a field unchanged)."""
    row = get_row("notes", note_id, "note")
    if title:
        row["title"] = title
    if body:
        row["body"] = body
    row["updated"] = fixtures.day(0)
    return clone(row)


@DOMAIN.tool
def append_to_note(note_id: str, text: str) -> Note:
    """Append a line of text to a note."""
    row = get_row("notes", note_id, "note")
    row["body"] = (row["body"] + "\n" + text) if row["body"] else text
    row["updated"] = fixtures.day(0)
    return clone(row)


@DOMAIN.tool
def delete_note(note_id: str) -> Deleted:
    """Delete a note."""
    return delete_row("notes", note_id, "note")


@DOMAIN.tool
def list_notes(tag: str = "") -> NoteList:
    """List notes, optionally with one tag."""
    rows = [n for n in db()["notes"].values() if not tag or tag in n["tags"]]
    return {"notes": clone(rows), "count": len(rows)}


@DOMAIN.tool
def search_notes(query: str) -> NoteList:
    """Search notes by title or body substring."""
    q = query.lower()
    rows = [n for n in db()["notes"].values() if q in n["title"].lower() or q in n["body"].lower()]
    return {"notes": clone(rows), "count": len(rows)}


@DOMAIN.tool
def tag_note(note_id: str, tag: str) -> Note:
    """Add a tag to a note."""
    row = get_row("notes", note_id, "note")
    if tag not in row["tags"]:
        row["tags"].append(tag)
    return clone(row)


@DOMAIN.tool
def share_note(note_id: str, email: str) -> Note:
    """Share a note with someone by email."""
    if "@" not in email:
        fail(f"'email' must look like name@domain; got {email!r}")
    row = get_row("notes", note_id, "note")
    if email not in row["shared_with"]:
        row["shared_with"].append(email)
    return clone(row)


@DOMAIN.tool
def list_tags() -> TagList:
    """List all tags in use."""
    return {"tags": sorted({t for n in db()["notes"].values() for t in n["tags"]})}
