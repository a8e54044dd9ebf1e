"""The built-in model's inner optimizer: AdamW (decoupled weight decay), one parameter group.

The same float operations in the same order as torch.optim.AdamW's single-tensor path (the one
torch takes for CPU tensors), so its values are torch's bit for bit
(tests/unit/test_adamw.py). Why not torch's own: every `torch.optim.Optimizer` imports
torch._dynamo (and sympy) on its first call of `add_param_group` and of `step`, about 2 CPU
seconds, in every learner process that starts. This one never does; a user's own optimizer,
whatever it is, is handed to `atoll.Learner` as before.

Read and written as torch's are: `param_groups` (its "lr" set by the schedule before each
step), `step()`, `zero_grad(set_to_none=True)`, `state_dict()` / `load_state_dict()`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class AdamW:
    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        if not lr >= 0.0:
            raise ValueError(f"lr={lr!r} is not allowed: a number >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas={betas!r} is not allowed: each in [0, 1)")
        plist = list(params)
        if not plist:
            raise ValueError("AdamW got no parameters")
        self.param_groups: list[dict[str, Any]] = [
            {"params": plist, "lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        ]
        self.state: dict[torch.Tensor, dict[str, Any]] = {}

    @torch.no_grad()
    def step(self) -> None:
        for group in self.param_groups:
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state.get(p)
                if st is None:
                    st = self.state[p] = {
                        "step": 0.0,
                        "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                        "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format),
                    }
                self._update(p, p.grad, st, lr, beta1, beta2, eps, wd)

    @staticmethod
    def _update(
        p: torch.Tensor, grad: torch.Tensor, st: dict[str, Any],
        lr: float, beta1: float, beta2: float, eps: float, wd: float,
    ) -> None:  # fmt: skip
        st["step"] += 1.0
        step = st["step"]
        if wd != 0:
            p.mul_(1 - lr * wd)
        st["exp_avg"].lerp_(grad, 1 - beta1)
        st["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step_size = lr / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        denom = (st["exp_avg_sq"].sqrt() / bias_correction2_sqrt).add_(eps)
        p.addcdiv_(st["exp_avg"], denom, value=-step_size)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def state_dict(self) -> dict[str, Any]:
        """Per parameter, by its index in the group: step and both moments (torch's layout)."""
        group = self.param_groups[0]
        index = {id(p): i for i, p in enumerate(group["params"])}
        state = {index[id(p)]: dict(s) for p, s in self.state.items()}
        meta = {k: v for k, v in group.items() if k != "params"}
        return {"state": state, "param_groups": [{**meta, "params": list(index.values())}]}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        group = self.param_groups[0]
        params = group["params"]
        (saved,) = sd["param_groups"]
        if len(saved["params"]) != len(params):
            raise ValueError(
                f"state of {len(saved['params'])} parameters; this optimizer has {len(params)}"
            )
        group.update({k: v for k, v in saved.items() if k != "params"})
        self.state = {}
        for i, s in sd["state"].items():
            p = params[int(i)]
            self.state[p] = {
                "step": float(s["step"]),
                "exp_avg": s["exp_avg"].to(p.device, p.dtype).clone(),
                "exp_avg_sq": s["exp_avg_sq"].to(p.device, p.dtype).clone(),
            }
