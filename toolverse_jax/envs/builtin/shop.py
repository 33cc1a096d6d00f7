"""Built-in shop server: product catalog, cart, orders, refunds, shipments (seeded store)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, get_row, next_id


class Product(TypedDict):
    product_id: str
    name: str
    category: str
    price: float
    stock: int


class ProductList(TypedDict):
    products: list[Product]
    count: int


class CartItem(TypedDict):
    product_id: str
    name: str
    quantity: int
    price: float


class Cart(TypedDict):
    items: list[CartItem]
    total: float


class Order(TypedDict):
    order_id: str
    items: list[CartItem]
    total: float
    status: str
    shipping_address: str
    date: str


class OrderList(TypedDict):
    orders: list[Order]
    count: int


class Refund(TypedDict):
    refund_id: str
    order_id: str
    amount: float
    reason: str


class Shipment(TypedDict):
    order_id: str
    carrier: str
    tracking_number: str
    status: str
    eta: str


def _init(rng, seed, sandbox):
    products = {}
    for i, (name, cat, price) in enumerate(fixtures.PRODUCTS):
        pid = f"pr_{i + 1:04d}"
        products[pid] = {"product_id": pid, "name": name, "category": cat,
                         "price": round(price * rng.choice([0.9, 1.0, 1.1]), 2), "stock": rng.randint(0, 30)}
    orders = {}
    for i in range(4):
        oid = f"ord_{i + 1:04d}"
        ps = rng.sample(list(products.values()), 2)
        items = [{"product_id": p["product_id"], "name": p["name"], "quantity": 1, "price": p["price"]} for p in ps]
        orders[oid] = {"order_id": oid, "items": items, "total": round(sum(p["price"] for p in ps), 2),
                       "status": rng.choice(["delivered", "shipped", "processing"]),
                       "shipping_address": "12 Market St, San Francisco", "date": fixtures.day(-rng.randint(2, 20))}
    return {"products": products, "cart": [], "orders": orders, "refunds": {}, "_counters": {"ord": 4}}


DOMAIN = Domain("shop", "Online store: search products, manage a cart, place and track orders.", _init)


@DOMAIN.tool
def search_products(query: str = "", category: str = "", max_price: float = 1e9) -> ProductList:
    """Search products by name substring, category and maximum price."""
    q = query.lower()
    rows = [p for p in db()["products"].values()
            if q in p["name"].lower() and (not category or p["category"] == category) and p["price"] <= max_price]
    return {"products": clone(rows), "count": len(rows)}


@DOMAIN.tool
def get_product(product_id: str) -> Product:
    """Get a product by id."""
    return clone(get_row("products", product_id, "product"))


@DOMAIN.tool
def add_to_cart(product_id: str, quantity: int = 1) -> Cart:
    """Add a product to the cart."""
    p = get_row("products", product_id, "product")
    if quantity < 1:
        fail(f"'quantity' must be >= 1; got {quantity}")
    if p["stock"] < quantity:
        fail(f"only {p['stock']} of {product_id} in stock")
    db()["cart"].append({"product_id": product_id, "name": p["name"], "quantity": quantity, "price": p["price"]})
    return view_cart()


@DOMAIN.tool
def view_cart() -> Cart:
    """Show the cart and its total."""
    items = clone(db()["cart"])
    return {"items": items, "total": round(sum(i["price"] * i["quantity"] for i in items), 2)}


@DOMAIN.tool
def checkout(shipping_address: str) -> Order:
    """Place an order for everything in the cart."""
    cart = view_cart()
    if not cart["items"]:
        fail("the cart is empty; add_to_cart first")
    for it in cart["items"]:
        db()["products"][it["product_id"]]["stock"] -= it["quantity"]
    oid = next_id("ord")
    row = {"order_id": oid, "items": cart["items"], "total": cart["total"], "status": "processing",
           "shipping_address": shipping_address, "date": fixtures.day(0)}
    db()["orders"][oid] = row
    db()["cart"] = []
    return clone(row)


@DOMAIN.tool
def get_order(order_id: str) -> Order:
    """Get an order by id."""
    return clone(get_row("orders", order_id, "order"))


@DOMAIN.tool
def list_orders(status: str = "") -> OrderList:
    """List orders, optionally by status (processing, shipped, delivered, cancelled, refunded)."""
    rows = [o for o in db()["orders"].values() if not status or o["status"] == status]
    return {"orders": clone(rows), "count": len(rows)}


@DOMAIN.tool
def cancel_order(order_id: str) -> Order:
    """Cancel an order that has not shipped yet."""
    o = get_row("orders", order_id, "order")
    if o["status"] != "processing":
        fail(f"order {order_id} is {o['status']}; only processing orders can be cancelled")
    o["status"] = "cancelled"
    return clone(o)


@DOMAIN.tool
def request_refund(order_id: str, reason: str) -> Refund:
    """Refund a delivered order; returns the refunded amount."""
    o = get_row("orders", order_id, "order")
    if o["status"] != "delivered":
        fail(f"order {order_id} is {o['status']}; only delivered orders can be refunded")
    o["status"] = "refunded"
    rid = next_id("rf")
    row = {"refund_id": rid, "order_id": order_id, "amount": o["total"], "reason": reason}
    db()["refunds"][rid] = row
    return clone(row)


@DOMAIN.tool
def track_shipment(order_id: str) -> Shipment:
    """Track the shipment of an order."""
    o = get_row("orders", order_id, "order")
    n = int(order_id.split("_")[-1])
    return {"order_id": order_id, "carrier": "UPS", "tracking_number": f"1Z{n:06d}{len(o['items'])}",
            "status": o["status"], "eta": fixtures.day(3)}
