"""Built-in calendar server: events with dates, times and attendees (seeded agenda)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, delete_row, get_row, next_id


class Event(TypedDict):
    event_id: str
    title: str
    date: str
    start_time: str
    end_time: str
    location: str
    attendees: list[str]
    status: str


class EventList(TypedDict):
    events: list[Event]
    count: int


class Slot(TypedDict):
    date: str
    start_time: str
    end_time: str


class Deleted(TypedDict):
    event_id: str
    deleted: bool


def _init(rng, seed, sandbox):
    ppl = fixtures.people(seed)
    ev = {}
    for i in range(10):
        eid = f"ev_{i + 1:04d}"
        h = rng.randint(8, 16)
        ev[eid] = {"event_id": eid, "title": rng.choice(["Standup", "1:1", "Design review", "Lunch",
                                                          "Planning", "Customer call"]),
                   "date": fixtures.day(rng.randint(0, 14)), "start_time": f"{h:02d}:00",
                   "end_time": f"{h + 1:02d}:00", "location": rng.choice(["Room A", "Room B", "Zoom"]),
                   "attendees": [p["email"] for p in rng.sample(ppl, 2)], "status": "confirmed"}
    return {"events": ev, "_counters": {"ev": 10}}


DOMAIN = Domain("calendar", "Calendar of alex.morgan@example.com: events, attendees, free slots.", _init)


def _time(s: str, param: str) -> str:
    parts = s.split(":")
    if len(parts) != 2 or not all(p.isdigit() for p in parts) or not (0 <= int(parts[0]) < 24 and 0 <= int(parts[1]) < 60):
        fail(f"'{param}' must be a time 'HH:MM'; got {s!r}")
    return f"{int(parts[0]):02d}:{int(parts[1]):02d}"


def _date(s: str, param: str = "date") -> str:
    try:
        return fixtures.parse_date(s, param).isoformat()
    except ValueError as e:
        fail(str(e))


@DOMAIN.tool
def list_events(date_from: str = "2026-01-01", date_to: str = "2026-12-31") -> EventList:
    """List events between two dates (inclusive), sorted by date and time."""
    a, b = _date(date_from, "date_from"), _date(date_to, "date_to")
    rows = sorted((e for e in db()["events"].values() if a <= e["date"] <= b),
                  key=lambda e: (e["date"], e["start_time"], e["event_id"]))
    return {"events": clone(rows), "count": len(rows)}


@DOMAIN.tool
def get_event(event_id: str) -> Event:
    """Get an event by id."""
    return clone(get_row("events", event_id, "event"))


@DOMAIN.tool
def create_event(title: str, date: str, start_time: str, end_time: str, attendees: list[str] = [],
                 location: str = "") -> Event:
    """Create an event; attendees are email addresses."""
    st, et = _time(start_time, "start_time"), _time(end_time, "end_time")
    if et <= st:
        fail(f"'end_time' {et} must be after 'start_time' {st}")
    eid = next_id("ev")
    row = {"event_id": eid, "title": title, "date": _date(date), "start_time": st, "end_time": et,
           "location": location, "attendees": list(attendees), "status": "confirmed"}
    db()["events"][eid] = row
    return clone(row)


@DOMAIN.tool
def update_event(event_id: str, title: str = "", date: str = "", start_time: str = "", end_time: str = "",
                 location: str = "") -> Event:
    """Update fields of an event (empty strings leave a field unchanged)."""
    row = get_row("events", event_id, "event")
    if title:
        row["title"] = title
    if date:
        row["date"] = _date(date)
    if start_time:
        row["start_time"] = _time(start_time, "start_time")
    if end_time:
        row["end_time"] = _time(end_time, "end_time")
    if location:
        row["location"] = location
    return clone(row)


@DOMAIN.tool
def delete_event(event_id: str) -> Deleted:
    """Delete an event."""
    return delete_row("events", event_id, "event")


@DOMAIN.tool
def add_attendee(event_id: str, email: str) -> Event:
    """Invite one more attendee (email) to an event."""
    if "@" not in email:
        fail(f"'email' must look like name@domain; got {email!r}")
    row = get_row("events", event_id, "event")
    if email not in row["attendees"]:
        row["attendees"].append(email)
    return clone(row)


@DOMAIN.tool
def cancel_event(event_id: str) -> Event:
    """Mark an event cancelled (attendees are notified)."""
    row = get_row("events", event_id, "event")
    row["status"] = "cancelled"
    return clone(row)


@DOMAIN.tool
def find_free_slot(date: str, duration_minutes: int = 60) -> Slot:
    """Find the first free slot between 08:00 and 18:00 on a date."""
    d = _date(date)
    busy = sorted((e["start_time"], e["end_time"]) for e in db()["events"].values()
                  if e["date"] == d and e["status"] != "cancelled")
    t = 8 * 60
    for s, e in busy + [("18:00", "18:00")]:
        s_min = int(s[:2]) * 60 + int(s[3:])
        if s_min - t >= duration_minutes:
            break
        t = max(t, int(e[:2]) * 60 + int(e[3:]))
    if t + duration_minutes > 18 * 60:
        fail(f"no free slot of {duration_minutes} minutes on {d}")
    end = t + duration_minutes
    return {"date": d, "start_time": f"{t // 60:02d}:{t % 60:02d}", "end_time": f"{end // 60:02d}:{end % 60:02d}"}
