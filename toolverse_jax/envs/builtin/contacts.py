"""Built-in contacts server: people with emails/phones/companies, groups (seeded address book)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, delete_row, get_row, next_id


class Contact(TypedDict):
    contact_id: str
    name: str
    email: str
    phone: str
    company: str
    city: str
    groups: list[str]


class ContactList(TypedDict):
    contacts: list[Contact]
    count: int


class GroupList(TypedDict):
    groups: list[str]


class Deleted(TypedDict):
    contact_id: str
    deleted: bool


def _init(rng, seed, sandbox):
    rows = {}
    for i, p in enumerate(fixtures.people(seed)):
        cid = f"ct_{i + 1:04d}"
        rows[cid] = dict(p, contact_id=cid, groups=[rng.choice(["work", "friends", "family"])])
    return {"contacts": rows, "groups": ["work", "friends", "family"], "_counters": {"ct": len(rows)}}


DOMAIN = Domain("contacts", "Address book: find people, their emails, phones and companies.", _init)


def _list(rows, limit):
    out = [clone(r) for r in rows][: max(0, limit)]
    return {"contacts": out, "count": len(out)}


@DOMAIN.tool
def list_contacts(group: str = "", limit: int = 50) -> ContactList:
    """List contacts, optionally only those in a group."""
    return _list([c for c in db()["contacts"].values() if not group or group in c["groups"]], limit)


@DOMAIN.tool
def search_contacts(query: str, limit: int = 20) -> ContactList:
    """Search contacts by name, email, company or city (substring)."""
    q = query.lower()
    return _list([c for c in db()["contacts"].values()
                  if any(q in str(c[k]).lower() for k in ("name", "email", "company", "city"))], limit)


@DOMAIN.tool
def get_contact(contact_id: str) -> Contact:
    """Get a contact by id."""
    return clone(get_row("contacts", contact_id, "contact"))


@DOMAIN.tool
def find_contact_by_email(email: str) -> Contact:
    """Get the contact with this exact email address."""
    for c in db()["contacts"].values():
        if c["email"].lower() == email.lower():
            return clone(c)
    fail(f"no contact has email {email!r}; use search_contacts to find one")


@DOMAIN.tool
def create_contact(name: str, email: str, phone: str = "", company: str = "", city: str = "") -> Contact:
    """Create a contact."""
    if "@" not in email:
        fail(f"'email' must look like name@domain; got {email!r}")
    cid = next_id("ct")
    row = {"contact_id": cid, "name": name, "email": email, "phone": phone, "company": company,
           "city": city, "groups": []}
    db()["contacts"][cid] = row
    return clone(row)


@DOMAIN.tool
def update_contact(contact_id: str, name: str = "", email: str = "", phone: str = "", company: str = "",
                   city: str = "") -> Contact:
    """Update fields of a contact (empty strings leave a field unchanged)."""
    row = get_row("contacts", contact_id, "contact")
    for k, v in (("name", name), ("email", email), ("phone", phone), ("company", company), ("city", city)):
        if v:
            row[k] = v
    return clone(row)


@DOMAIN.tool
def delete_contact(contact_id: str) -> Deleted:
    """Delete a contact."""
    return delete_row("contacts", contact_id, "contact")


@DOMAIN.tool
def list_groups() -> GroupList:
    """List contact groups."""
    return {"groups": list(db()["groups"])}


@DOMAIN.tool
def add_to_group(contact_id: str, group: str) -> Contact:
    """Add a contact to a group (the group is created if new)."""
    row = get_row("contacts", contact_id, "contact")
    if group not in db()["groups"]:
        db()["groups"].append(group)
    if group not in row["groups"]:
        row["groups"].append(group)
    return clone(row)
