"""``python -m tensorfs.sources.transports.helper``: the process that runs obstore for a process that
will fork (``tensorfs.sources.transports.objects``, "where obstore runs")."""

from tensorfs.sources.transports.objects import helper_main

if __name__ == "__main__":
    helper_main()
