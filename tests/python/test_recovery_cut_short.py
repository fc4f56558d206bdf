"""dlrun.recovery.cut_short_when, in both eras (ctest runs this file under torch 1.13's and torch
2.13's interpreters), without a job: a step the step watch frees as it computes stops at its next
gradient.

- Freed in the middle of a backward pass: the pass raises at the next parameter's gradient, and
  the parameters before it in the model (their gradients come last) get none.
- Not freed: the pass and its gradients are as without the hooks, bit for bit.
- A parameter that needs no gradient gets no hook, and a freed flag set between steps stops the
  next pass at its first gradient.
"""

import os
import sys
import unittest

from dlrun_fixture import main

sys.path.insert(0, os.environ["DLRUN_PYTHONDIR"])
import torch  # noqa: E402

from dlrun.recovery import cut_short_when  # noqa: E402

LAYERS = 6


def model_and_batch():
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(LAYERS)])
    return model, torch.randn(8, 16)


class CutShortTest(unittest.TestCase):
    def test_a_pass_freed_midway_stops_at_the_next_gradient(self):
        model, x = model_and_batch()
        freed = [False]
        cut_short_when(model, lambda: freed[0])
        last = model[LAYERS - 1]
        # The watch frees the step once the last layer's weight has its gradient.
        last.weight.register_hook(lambda grad: freed.__setitem__(0, True))
        with self.assertRaisesRegex(RuntimeError, "freed as it computed its gradients"):
            model(x).sum().backward()
        self.assertIsNone(model[0].weight.grad)
        self.assertIsNone(model[0].bias.grad)

    def test_a_pass_not_freed_is_as_without_the_hooks(self):
        plain, x = model_and_batch()
        hooked, _ = model_and_batch()
        cut_short_when(hooked, lambda: False)
        plain(x).sum().backward()
        hooked(x).sum().backward()
        for a, b in zip(plain.parameters(), hooked.parameters()):
            self.assertTrue(torch.equal(a.grad, b.grad))

    def test_frozen_parameters_get_no_hook_and_a_freed_step_stops_at_once(self):
        model, x = model_and_batch()
        for parameter in model[LAYERS - 1].parameters():
            parameter.requires_grad_(False)
        freed = [False]
        cut_short_when(model, lambda: freed[0])
        model(x).sum().backward()  # not freed: the whole pass
        self.assertIsNotNone(model[0].weight.grad)
        model.zero_grad(set_to_none=True)
        freed[0] = True
        with self.assertRaisesRegex(RuntimeError, "freed"):
            model(x).sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        self.assertEqual(sum(g is not None for g in grads), 0)


if __name__ == "__main__":
    main()
