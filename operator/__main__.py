"""`python -m horizonserve.operator`: run the operator (kopf, standalone, with liveness).

Watches one namespace when HORIZONSERVE_NAMESPACE is set, else all namespaces; serves
`/healthz` at HORIZONSERVE_LIVENESS (default http://0.0.0.0:8080/healthz). See settings.py
for the other environment variables.
"""

from __future__ import annotations

import logging
import sys

import kopf

from horizonserve.operator.settings import OperatorConfig


def main() -> int:
    try:
        config = OperatorConfig.from_env()
    except ValueError as exc:
        print(f"horizonserve operator: error: {exc}", file=sys.stderr)
        return 2
    kopf.configure(debug=config.log_level == "DEBUG")
    logging.getLogger().setLevel(config.log_level)
    from horizonserve.operator import handlers  # noqa: F401  (registers the handlers)

    scope: dict[str, object] = (
        {"namespaces": [config.namespace]} if config.namespace else {"clusterwide": True}
    )
    kopf.run(standalone=True, liveness_endpoint=config.liveness_endpoint, **scope)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
