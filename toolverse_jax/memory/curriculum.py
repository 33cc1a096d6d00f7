"""Session-horizon curriculum (8 -> 16 -> 32): advance when validation accuracy passes a threshold.

The state is a small JSON-able dict saved in checkpoint metadata, so a resumed run continues
at the stage it had reached; every transition is recorded (step, from, to, accuracy).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence


@dataclasses.dataclass
class Curriculum:
    stages: tuple[int, ...] = (8, 16, 32)
    threshold: float = 0.6
    min_evals: int = 1           # validations at a stage before it may advance
    stage: int = 0
    evals_at_stage: int = 0
    transitions: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.stages = tuple(int(s) for s in self.stages)
        if not self.stages or list(self.stages) != sorted(set(self.stages)):
            raise ValueError(f"curriculum stages must be increasing session counts, e.g. "
                             f"(8, 16, 32); got {self.stages}")
        if not 0 <= self.stage < len(self.stages):
            raise ValueError(f"curriculum stage {self.stage} is outside 0..{len(self.stages) - 1}")

    @property
    def num_sessions(self) -> int:
        """Returns the session horizon of the current stage."""
        return self.stages[self.stage]

    @property
    def final(self) -> bool:
        return self.stage == len(self.stages) - 1

    def observe(self, step: int, accuracy: float) -> bool:
        """Records a validation accuracy at the current stage; returns True if it advanced."""
        self.evals_at_stage += 1
        if self.final or self.evals_at_stage < self.min_evals or accuracy < self.threshold:
            return False
        self.transitions.append({"step": int(step), "from": self.num_sessions,
                                 "to": self.stages[self.stage + 1], "accuracy": float(accuracy)})
        self.stage += 1
        self.evals_at_stage = 0
        return True

    def to_json(self) -> dict:
        return {"stages": list(self.stages), "threshold": self.threshold,
                "min_evals": self.min_evals, "stage": self.stage,
                "evals_at_stage": self.evals_at_stage, "transitions": list(self.transitions)}

    @classmethod
    def from_json(cls, d: dict, stages: Sequence[int] | None = None) -> "Curriculum":
        """Returns the curriculum saved in `d`; `stages` (the config's) must match the saved."""
        if stages is not None and tuple(stages) != tuple(d["stages"]):
            raise ValueError(f"checkpoint curriculum stages {tuple(d['stages'])} differ from the "
                             f"config's {tuple(stages)}; use the original config or a new workdir")
        return cls(tuple(d["stages"]), d["threshold"], d["min_evals"], d["stage"],
                   d["evals_at_stage"], list(d["transitions"]))
