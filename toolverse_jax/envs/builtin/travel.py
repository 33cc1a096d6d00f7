"""Built-in travel server: flights and hotels, bookings with dates and prices (seeded inventory)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, get_row, next_id


class Flight(TypedDict):
    flight_id: str
    origin: str
    destination: str
    date: str
    departure_time: str
    arrival_time: str
    price: float
    seats_left: int


class FlightList(TypedDict):
    flights: list[Flight]
    count: int


class Hotel(TypedDict):
    hotel_id: str
    name: str
    city: str
    price_per_night: float
    rating: float


class HotelList(TypedDict):
    hotels: list[Hotel]
    count: int


class Booking(TypedDict):
    booking_id: str
    kind: str
    item_id: str
    traveler_name: str
    traveler_email: str
    date: str
    nights: int
    total_price: float
    status: str


class BookingList(TypedDict):
    bookings: list[Booking]
    count: int


class Airport(TypedDict):
    code: str
    city: str


class AirportList(TypedDict):
    airports: list[Airport]


def _init(rng, seed, sandbox):
    flights, n = {}, 0
    codes = [c for c, _ in fixtures.CITIES]
    for d in range(0, 21, 2):
        for _ in range(4):
            o, t = rng.sample(codes, 2)
            n += 1
            h = rng.randint(6, 20)
            fid = f"fl_{n:04d}"
            flights[fid] = {"flight_id": fid, "origin": o, "destination": t, "date": fixtures.day(d),
                            "departure_time": f"{h:02d}:{rng.choice(['00', '30'])}",
                            "arrival_time": f"{(h + rng.randint(1, 3)) % 24:02d}:15",
                            "price": float(rng.randint(90, 900)), "seats_left": rng.randint(0, 9)}
    hotels = {}
    for i, (_, city) in enumerate(fixtures.CITIES):
        for j in range(2):
            hid = f"ht_{2 * i + j + 1:04d}"
            hotels[hid] = {"hotel_id": hid, "name": f"{rng.choice(['Grand', 'Harbor', 'Park', 'Central'])} {city}",
                           "city": city, "price_per_night": float(rng.randint(80, 400)),
                           "rating": round(rng.uniform(3, 5), 1)}
    return {"flights": flights, "hotels": hotels, "bookings": {}}


DOMAIN = Domain("travel", "Travel agency: search and book flights and hotels.", _init)


def _date(s: str, param: str) -> str:
    try:
        return fixtures.parse_date(s, param).isoformat()
    except ValueError as e:
        fail(str(e))


@DOMAIN.tool
def list_airports() -> AirportList:
    """List airports (IATA code and city)."""
    return {"airports": [{"code": c, "city": n} for c, n in fixtures.CITIES]}


@DOMAIN.tool
def search_flights(origin: str, destination: str, date: str = "") -> FlightList:
    """Search flights by origin and destination IATA codes, optionally on one date."""
    d = _date(date, "date") if date else ""
    rows = [f for f in db()["flights"].values() if f["origin"] == origin.upper()
            and f["destination"] == destination.upper() and (not d or f["date"] == d)]
    return {"flights": clone(rows), "count": len(rows)}


@DOMAIN.tool
def get_flight(flight_id: str) -> Flight:
    """Get a flight by id."""
    return clone(get_row("flights", flight_id, "flight"))


@DOMAIN.tool
def book_flight(flight_id: str, traveler_name: str, traveler_email: str) -> Booking:
    """Book a seat on a flight."""
    f = get_row("flights", flight_id, "flight")
    if f["seats_left"] < 1:
        fail(f"flight {flight_id} is full; search_flights for another")
    f["seats_left"] -= 1
    bid = next_id("bk")
    row = {"booking_id": bid, "kind": "flight", "item_id": flight_id, "traveler_name": traveler_name,
           "traveler_email": traveler_email, "date": f["date"], "nights": 0, "total_price": f["price"],
           "status": "confirmed"}
    db()["bookings"][bid] = row
    return clone(row)


@DOMAIN.tool
def search_hotels(city: str, max_price_per_night: float = 1e9) -> HotelList:
    """Search hotels in a city."""
    rows = [h for h in db()["hotels"].values()
            if h["city"].lower() == city.lower() and h["price_per_night"] <= max_price_per_night]
    return {"hotels": clone(rows), "count": len(rows)}


@DOMAIN.tool
def book_hotel(hotel_id: str, traveler_name: str, traveler_email: str, check_in: str, nights: int) -> Booking:
    """Book a hotel for a number of nights from a check-in date."""
    h = get_row("hotels", hotel_id, "hotel")
    if nights < 1:
        fail(f"'nights' must be >= 1; got {nights}")
    bid = next_id("bk")
    row = {"booking_id": bid, "kind": "hotel", "item_id": hotel_id, "traveler_name": traveler_name,
           "traveler_email": traveler_email, "date": _date(check_in, "check_in"), "nights": nights,
           "total_price": round(h["price_per_night"] * nights, 2), "status": "confirmed"}
    db()["bookings"][bid] = row
    return clone(row)


@DOMAIN.tool
def get_booking(booking_id: str) -> Booking:
    """Get a booking by id."""
    return clone(get_row("bookings", booking_id, "booking"))


@DOMAIN.tool
def list_bookings() -> BookingList:
    """List all bookings."""
    rows = list(db()["bookings"].values())
    return {"bookings": clone(rows), "count": len(rows)}


@DOMAIN.tool
def cancel_booking(booking_id: str) -> Booking:
    """Cancel a booking (flight seats are released)."""
    b = get_row("bookings", booking_id, "booking")
    if b["status"] == "cancelled":
        fail(f"booking {booking_id} is already cancelled")
    b["status"] = "cancelled"
    if b["kind"] == "flight":
        db()["flights"][b["item_id"]]["seats_left"] += 1
    return clone(b)
