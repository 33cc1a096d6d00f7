"""Built-in bank server: accounts, balances, transfers, payees, bills (seeded ledger)."""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin import fixtures
from toolverse_jax.envs.builtin.base import Domain, clone, db, fail, get_row, next_id


class Account(TypedDict):
    account_id: str
    name: str
    account_number: str
    balance: float
    currency: str


class AccountList(TypedDict):
    accounts: list[Account]


class Transaction(TypedDict):
    transaction_id: str
    account_id: str
    amount: float
    counterparty: str
    memo: str
    date: str
    kind: str


class TransactionList(TypedDict):
    transactions: list[Transaction]
    count: int


class Payee(TypedDict):
    payee_id: str
    name: str
    email: str
    account_number: str


class PayeeList(TypedDict):
    payees: list[Payee]


class Balance(TypedDict):
    account_id: str
    balance: float
    currency: str


class Rate(TypedDict):
    from_currency: str
    to_currency: str
    rate: float


RATES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CAD": 1.36}


def _init(rng, seed, sandbox):
    acc = {}
    for i, (name, cur) in enumerate([("Checking", "USD"), ("Savings", "USD"), ("Travel", "EUR")]):
        aid = f"acc_{i + 1:04d}"
        acc[aid] = {"account_id": aid, "name": name, "account_number": f"{rng.randint(10**9, 10**10 - 1)}",
                    "balance": round(rng.uniform(500, 9000), 2), "currency": cur}
    payees = {}
    for i, p in enumerate(fixtures.people(seed)[:8]):
        pid = f"py_{i + 1:04d}"
        payees[pid] = {"payee_id": pid, "name": p["name"], "email": p["email"],
                       "account_number": f"{rng.randint(10**9, 10**10 - 1)}"}
    tx = {}
    for i in range(10):
        tid = f"tx_{i + 1:04d}"
        p = rng.choice(list(payees.values()))
        tx[tid] = {"transaction_id": tid, "account_id": "acc_0001", "amount": -round(rng.uniform(5, 300), 2),
                   "counterparty": p["name"], "memo": rng.choice(["groceries", "dinner", "rent share", "gift"]),
                   "date": fixtures.day(-rng.randint(1, 30)), "kind": "transfer"}
    return {"accounts": acc, "payees": payees, "transactions": tx, "_counters": {"tx": 10, "py": 8}}


DOMAIN = Domain("bank", "Bank accounts of Alex Morgan: balances, transactions, transfers, payees.", _init)


def _amount(amount: float) -> float:
    if not amount > 0:
        fail(f"'amount' must be a positive number; got {amount}")
    return round(float(amount), 2)


def _debit(account_id: str, amount: float, counterparty: str, memo: str, kind: str) -> Transaction:
    acc = get_row("accounts", account_id, "account")
    amount = _amount(amount)
    if acc["balance"] < amount:
        fail(f"insufficient funds in {account_id}: balance {acc['balance']:.2f} < {amount:.2f}")
    acc["balance"] = round(acc["balance"] - amount, 2)
    tid = next_id("tx")
    row = {"transaction_id": tid, "account_id": account_id, "amount": -amount, "counterparty": counterparty,
           "memo": memo, "date": fixtures.day(0), "kind": kind}
    db()["transactions"][tid] = row
    return clone(row)


@DOMAIN.tool
def list_accounts() -> AccountList:
    """List the user's accounts with balances."""
    return {"accounts": clone(list(db()["accounts"].values()))}


@DOMAIN.tool
def get_balance(account_id: str) -> Balance:
    """Get the balance of an account."""
    a = get_row("accounts", account_id, "account")
    return {"account_id": account_id, "balance": a["balance"], "currency": a["currency"]}


@DOMAIN.tool
def list_transactions(account_id: str, limit: int = 20) -> TransactionList:
    """List recent transactions of an account (newest first)."""
    get_row("accounts", account_id, "account")
    rows = sorted((t for t in db()["transactions"].values() if t["account_id"] == account_id),
                  key=lambda t: (t["date"], t["transaction_id"]), reverse=True)[: max(0, limit)]
    return {"transactions": clone(rows), "count": len(rows)}


@DOMAIN.tool
def get_transaction(transaction_id: str) -> Transaction:
    """Get one transaction by id."""
    return clone(get_row("transactions", transaction_id, "transaction"))


@DOMAIN.tool
def transfer(from_account_id: str, to_account_number: str, amount: float, memo: str = "") -> Transaction:
    """Transfer money to an account number (own account or a payee's)."""
    if not to_account_number.isdigit():
        fail(f"'to_account_number' must be digits; got {to_account_number!r}")
    tx = _debit(from_account_id, amount, to_account_number, memo, "transfer")
    for a in db()["accounts"].values():
        if a["account_number"] == to_account_number:
            a["balance"] = round(a["balance"] + tx["amount"] * -1, 2)
    return tx


@DOMAIN.tool
def list_payees() -> PayeeList:
    """List saved payees."""
    return {"payees": clone(list(db()["payees"].values()))}


@DOMAIN.tool
def add_payee(name: str, email: str, account_number: str) -> Payee:
    """Save a new payee."""
    if not account_number.isdigit():
        fail(f"'account_number' must be digits; got {account_number!r}")
    pid = next_id("py")
    row = {"payee_id": pid, "name": name, "email": email, "account_number": account_number}
    db()["payees"][pid] = row
    return clone(row)


@DOMAIN.tool
def pay_payee(account_id: str, payee_id: str, amount: float, memo: str = "") -> Transaction:
    """Pay a saved payee from an account."""
    p = get_row("payees", payee_id, "payee")
    return _debit(account_id, amount, p["name"], memo, "payment")


@DOMAIN.tool
def get_exchange_rate(from_currency: str, to_currency: str) -> Rate:
    """Get the exchange rate between two currencies (USD, EUR, GBP, JPY, CAD)."""
    for c, p in ((from_currency, "from_currency"), (to_currency, "to_currency")):
        if c not in RATES:
            fail(f"'{p}' {c!r} is not supported; use one of {sorted(RATES)}")
    return {"from_currency": from_currency, "to_currency": to_currency,
            "rate": round(RATES[to_currency] / RATES[from_currency], 6)}
