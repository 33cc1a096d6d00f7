"""Built-in button panel for RL sanity checks (rl/sanity.py): press a colored button, read its code.

Every episode seed gives each button a distinct one-digit code (one token to copy, so a tiny
model learns the copy fast), and an answer that names the right code shows the right button
was pressed. `confirm` and `submit` are fixed follow-up steps (the multi-turn credit task: only
the press decides success). Hidden from the default catalog.
"""

from typing_extensions import TypedDict

from toolverse_jax.envs.builtin.base import Domain, db

COLORS = ("red", "blue", "green", "yellow")


class Pressed(TypedDict):
    button: str
    code: str


class Step(TypedDict):
    step: str
    ok: bool


def _init(rng, seed, sandbox):
    codes = rng.sample(range(10), len(COLORS))
    return {"codes": {c: str(v) for c, v in zip(COLORS, codes)}, "pressed": [], "steps": []}


DOMAIN = Domain("buttons", "A panel of colored buttons; each press shows that button's code "
                           "(RL sanity tasks, tests only).", _init)


def _press(color: str) -> Pressed:
    st = db()
    st["pressed"].append(color)
    return {"button": color, "code": st["codes"][color]}


@DOMAIN.tool
def press_red() -> Pressed:
    """Press the red button; returns its code."""
    return _press("red")


@DOMAIN.tool
def press_blue() -> Pressed:
    """Press the blue button; returns its code."""
    return _press("blue")


@DOMAIN.tool
def press_green() -> Pressed:
    """Press the green button; returns its code."""
    return _press("green")


@DOMAIN.tool
def press_yellow() -> Pressed:
    """Press the yellow button; returns its code."""
    return _press("yellow")


@DOMAIN.tool
def confirm() -> Step:
    """Confirm the presses so far."""
    db()["steps"].append("confirm")
    return {"step": "confirm", "ok": True}


@DOMAIN.tool
def submit() -> Step:
    """Submit the confirmed presses."""
    db()["steps"].append("submit")
    return {"step": "submit", "ok": True}
