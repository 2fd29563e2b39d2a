"""The stand-in pyxis: a SPANK plugin in C (one file per context: args.c says which runs where, and as whom), built by kit/cluster/plugin.py when real pyxis is not installed."""
