"""The helm binary fixture for tests/k8s/test_trust.py (it renders the chart's RBAC)."""

from tests.helm.conftest import helm_bin  # noqa: F401  (a fixture, used by name)
