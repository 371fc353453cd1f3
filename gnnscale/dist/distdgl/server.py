"""A DistDGL graph server (started by launch.py; its settings come in DGL's DGL_* environment variables).

It loads its machine's partition into shared memory and answers the trainers' sampling and feature
requests until trainer rank 0 shuts it down. `dgl.distributed.initialize` runs the server and exits.
"""

from __future__ import annotations

import logging
import os


def main() -> None:
    os.environ.setdefault("DGLBACKEND", "pytorch")
    # DGL warns once per interface without an IPv4 address (bridges, ifb devices): noise in every log.
    logging.getLogger("dgl-distributed-socket").setLevel(logging.ERROR)
    import dgl

    dgl.distributed.initialize(os.environ["DGL_IP_CONFIG"])


if __name__ == "__main__":
    main()
