"""HorizonServe Kubernetes operator (kopf): OmniService CRD, per-node serving pods, status."""
