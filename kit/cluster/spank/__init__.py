"""The stand-in pyxis: a SPANK plugin in C (kit_pyxis.c), built by kit/cluster/plugin.py when real pyxis is not installed."""
