"""File formats pipesched reads and writes besides its own schedule JSON.

One module per format: `torch_csv` (torch.distributed.pipelining's per-rank action CSV).
"""
