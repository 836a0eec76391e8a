"""Traced program: CPU training steps of a small PyTorch model (Debian's python3 with python3-torch).
train -> train_step -> forward/backward into libtorch. Runs for argv[1] seconds (default 3)."""
import sys
import time

import torch


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))


def train_step(model, opt, x, y):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss


def train(seconds):
    torch.set_num_threads(1)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(128, 256)
    y = torch.randint(0, 10, (128,))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        train_step(model, opt, x, y)


if __name__ == "__main__":
    train(float(sys.argv[1]) if len(sys.argv) > 1 else 3.0)
