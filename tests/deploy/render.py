"""Regenerate what is derived from other files in the repository.

- ``charts/magnetar-operator/crds/``: copies of the top-level ``crds/`` (plus kopf's peering CRDs);
- ``manifests/install.yaml``: the chart rendered with default values, CRDs included;
- ``manifests/argocd/argocd-cm.yaml``: the Lua health checks as an argocd-cm patch.

Run after changing the chart, the CRDs or a health script: ``python -m tests.deploy.render``.
"""

from __future__ import annotations

from tests.deploy import tools


def main() -> None:
    tools.sync_chart_crds()
    tools.INSTALL_YAML.write_text(tools.render_install())
    tools.ARGOCD_CM.write_text(tools.render_argocd_cm())
    for path in (tools.CHART_CRDS, tools.INSTALL_YAML, tools.ARGOCD_CM):
        print(f"updated {path.relative_to(tools.ROOT)}")


if __name__ == "__main__":
    main()
