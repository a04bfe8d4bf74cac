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

USAGE = """usage: python -m horizonserve.operator [--help]

Run the HorizonServe operator (kopf, standalone): it watches OmniServices, GPU nodes and
serving pods, keeps one serving pod on every matching GPU node, aggregates status, and (with a
certificate) serves the validating webhook. Configuration comes from the environment:

  HORIZONSERVE_NAMESPACE            only this namespace (empty: all namespaces)
  HORIZONSERVE_SERVING_IMAGE        serving image when a spec has no `image`
  HORIZONSERVE_LOG_LEVEL            DEBUG / INFO / WARNING / ERROR
  HORIZONSERVE_STATUS_INTERVAL      seconds between status aggregations (10)
  HORIZONSERVE_RESYNC_INTERVAL      seconds between reconciliation passes (2)
  HORIZONSERVE_SUMMARY_STALE_AFTER  a node summary older than this does not count (180)
  HORIZONSERVE_LIVENESS             liveness endpoint (http://0.0.0.0:8080/healthz)
  HORIZONSERVE_WEBHOOK_CERT_DIR     directory with tls.crt and tls.key: serve the webhook
  HORIZONSERVE_WEBHOOK_ADDR / _PORT where the webhook listens (0.0.0.0:9443)

Credentials: the in-cluster service account, else $KUBECONFIG.
"""


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args:
        if args[0] in ("-h", "--help"):
            print(USAGE, end="")
            return 0
        print(
            f"horizonserve operator: error: unknown argument {args[0]!r}\n{USAGE}", file=sys.stderr
        )
        return 2
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
