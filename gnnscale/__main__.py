"""`python -m gnnscale ...` (and `torchrun --nproc_per_node=N -m gnnscale train dist=ddp ...`)."""

from gnnscale.cli import main

main()
