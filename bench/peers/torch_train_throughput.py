"""The PyTorch peer of bench/train_throughput.py, to compare on the same day.

The training issue's peer figures (OpenNMT-tf ~410, PyTorch ~250 target tokens/s)
were measured on another day, and this workplace's hosts vary: the float32 matmul peak
measured by bench/ has ranged from ~120 to ~320 GFLOP/s on 2 cores. Running the peer
beside t2t_keras on the same machine, minutes apart, is the comparison that holds.

Same workload: Transformer base (6+6 layers, d_model 512, d_ff 2048, 8 heads, post-norm,
dropout 0.1), shared 32,000 vocabulary tied to the output layer, 64 sentence pairs x 32
tokens per side, random ids, label smoothing 0.1, Adam; float32, `torch.nn.Transformer`,
2 threads. Needs PyTorch, which t2t_keras does not depend on; use its own environment:

    python3 -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy
    /tmp/torchvenv/bin/python bench/peers/torch_train_throughput.py [--steps=5] [--repeats=3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn


def matmul_peak(size: int = 2048, seconds: float = 3.0) -> float:
  a, b = torch.randn(size, size), torch.randn(size, size)
  torch.matmul(a, b)
  best, deadline = 0.0, time.time() + seconds
  while time.time() < deadline:
    start = time.perf_counter()
    torch.matmul(a, b)
    best = max(best, 2 * size ** 3 / (time.perf_counter() - start))
  return best


class Model(nn.Module):
  def __init__(self, vocab: int, d: int = 512):
    super().__init__()
    self.d = d
    self.embedding = nn.Embedding(vocab, d)
    self.transformer = nn.Transformer(d, 8, 6, 6, 2048, 0.1, batch_first=True)
    position = torch.arange(512)[:, None]
    rates = torch.exp(torch.arange(0, d, 2) * (-torch.log(torch.tensor(10000.0)) / d))
    table = torch.zeros(512, d)
    table[:, 0::2], table[:, 1::2] = torch.sin(position * rates), torch.cos(position * rates)
    self.register_buffer("position", table)

  def embed(self, ids):
    return self.embedding(ids) * self.d ** 0.5 + self.position[:ids.shape[1]]

  def forward(self, inputs, targets):
    length = targets.shape[1]
    causal = nn.Transformer.generate_square_subsequent_mask(length)
    out = self.transformer(self.embed(inputs), self.embed(targets), tgt_mask=causal,
                           tgt_is_causal=True)
    return out @ self.embedding.weight.t()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=5)
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--vocab_size", type=int, default=32000)
  parser.add_argument("--threads", type=int, default=os.cpu_count())
  args = parser.parse_args()
  torch.set_num_threads(args.threads)
  torch.manual_seed(0)
  print(f"PyTorch {torch.__version__}, {args.threads} threads")
  peak = matmul_peak()
  print(f"measured float32 matmul peak: {peak / 1e9:.1f} GFLOP/s")
  model = Model(args.vocab_size)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
  loss_fn = nn.CrossEntropyLoss(label_smoothing=0.1)
  inputs = torch.randint(4, args.vocab_size, (args.batch, args.length))
  targets = torch.randint(4, args.vocab_size, (args.batch, args.length))

  def step():
    optimizer.zero_grad(set_to_none=True)
    logits = model(inputs, targets)
    loss = loss_fn(logits.reshape(-1, args.vocab_size), targets.reshape(-1))
    loss.backward()
    optimizer.step()
    return float(loss)

  for _ in range(2):
    step()
  runs = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.steps):
      step()
    runs.append((time.perf_counter() - start) / args.steps)
  seconds = statistics.median(runs)
  tokens = args.batch * args.length / seconds
  # Matmul FLOPs per step as bench/train_throughput.py counts them (t2t_keras.training.flops).
  d, f, layers, s, v = 512, 2048, 6, args.length, args.vocab_size
  per_token = (layers * (4 * d * d + 2 * d * f)  # encoder
               + layers * (8 * d * d + 2 * d * f)  # decoder: self + cross attention
               + d * v)  # output layer
  attention = 2 * layers * 3 * s * d  # scores and context, encoder/decoder/cross
  flop = 6 * (per_token + attention) * args.batch * args.length
  print("s/step per run: " + " ".join(f"{r:.2f}" for r in runs))
  print(f"float32 (PyTorch): {tokens:,.0f} target tokens/s, ratio to peak "
        f"{flop / seconds / peak:.2f}")


if __name__ == "__main__":
  main()
