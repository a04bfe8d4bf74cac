"""HorizonServe runtime: the serving system (control core, engines, simulator, benchmarks)."""

__version__ = "0.1.0"
