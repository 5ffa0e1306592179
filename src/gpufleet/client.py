"""Typed HTTP client for the head node's API, used by the CLI (sync) and the agent (async).

HTTP failures become the error tree's classes with the server's reason, so callers never see an
httpx exception or a status code.
"""

from __future__ import annotations

import ssl
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from gpufleet.core.errors import (
    Conflict,
    Forbidden,
    GpufleetError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthorized,
    Unavailable,
    describe,
)
from gpufleet.protocol.accounts import AccountList
from gpufleet.protocol.inventory import NodeInventory
from gpufleet.protocol.messages import JoinRequest, JoinResponse
from gpufleet.protocol.software import SoftwareInventory
from gpufleet.protocol.topology import IbFabric

_BY_STATUS: dict[int, type[GpufleetError]] = {
    400: InvalidInput,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: InvalidInput,
}
TIMEOUT = httpx.Timeout(30.0, connect=5.0)


def _reason(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        return response.text[:200] or response.reason_phrase
    if isinstance(detail, list) and detail:  # FastAPI's validation errors
        first = detail[0]
        where = ".".join(str(p) for p in first.get("loc", [])[1:])
        return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
    return str(detail)


def raise_for(response: httpx.Response) -> None:
    """Raise the matching GpufleetError for an error response."""
    if response.is_success:
        return
    cls = _BY_STATUS.get(response.status_code, Unavailable if response.status_code >= 500 else GpufleetError)
    raise cls(f"{_reason(response)} (HTTP {response.status_code})")


class HeadClient:
    """The CLI's client. Each method is one API call and returns decoded JSON."""

    def __init__(
        self,
        server: str,
        token: str | None,
        transport: httpx.BaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.server = server
        self._http = httpx.Client(base_url=server, headers=headers, timeout=TIMEOUT, transport=transport, verify=verify)

    def close(self) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the head node at {self.server}: {exc}") from None
        raise_for(response)
        return None if response.status_code == 204 else response.json()

    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/healthz")
        return result

    def password_login(self, username: str, password: str, expires_in_s: int) -> dict[str, Any]:
        body = {"username": username, "password": password, "expires_in_s": expires_in_s}
        result: dict[str, Any] = self._call("POST", "/api/v1/login", json=body)
        return result

    def sso_info(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/sso")
        return result

    def sso_login(self, id_token: str, expires_in_s: int) -> dict[str, Any]:
        body = {"id_token": id_token, "expires_in_s": expires_in_s}
        result: dict[str, Any] = self._call("POST", "/api/v1/login/sso", json=body)
        return result

    def whoami(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/whoami")
        return result

    def _pages(self, path: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every row of a paged list: the first page, then each `Link: <...>; rel="next"` the head names."""
        rows: list[dict[str, Any]] = []
        url: str | None = path
        while url is not None:
            try:
                response = self._http.request("GET", url, params=params if url == path else None)
            except httpx.HTTPError as exc:
                raise Unavailable(f"cannot reach the head node at {self.server}: {exc}") from None
            raise_for(response)
            rows += response.json()
            url = response.links.get("next", {}).get("url")
        return rows

    def list_nodes(self, names: str | None = None, page: int | None = None) -> list[dict[str, Any]]:
        """Every node (or those `names` names), `page` at a time (the head's largest page by default)."""
        params = ({"names": names} if names else {}) | ({"limit": page} if page else {})
        return self._pages("/api/v1/nodes", params)

    def show_node(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/nodes/{name}")
        return result

    def add_nodes(
        self, names: list[str], category: str | None, labels: dict[str, str], network: str | None = None
    ) -> list[dict[str, Any]]:
        body = {"names": names, "category": category, "labels": labels} | ({"network": network} if network else {})
        result: list[dict[str, Any]] = self._call("POST", "/api/v1/nodes", json=body)
        return result

    def remove_nodes(self, names: str) -> list[str]:
        result: list[str] = self._call("DELETE", "/api/v1/nodes", params={"names": names})
        return result

    def clone_node(self, source: str, names: list[str]) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("POST", f"/api/v1/nodes/{source}/clone", json={"names": names})
        return result

    def create_network(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/networks", json=spec)
        return result

    def list_networks(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/networks")
        return result

    def network_hosts(self, name: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/api/v1/networks/{name}/hosts")
        return result

    def set_mac(self, node: str, network: str, mac: str, interface: str | None) -> dict[str, Any]:
        body = {"mac": mac, "interface": interface}
        result: dict[str, Any] = self._call("PUT", f"/api/v1/nodes/{node}/interfaces/{network}", json=body)
        return result

    def dhcp_config(self, tftp_root: str | None) -> str:
        try:
            response = self._http.get(
                "/api/v1/provision/dhcp-config", params={"tftp_root": tftp_root} if tftp_root else None
            )
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the head node at {self.server}: {exc}") from None
        raise_for(response)
        return response.text

    # Tasks: slow actions over many nodes, followed while they run.
    def get_task(self, task_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/tasks/{task_id}")
        return result

    def list_tasks(self, kind: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"kind": kind} if kind else {})
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/tasks", params=params)
        return result

    def boot_files(self) -> dict[str, str]:
        result: dict[str, str] = self._call("GET", "/api/v1/provision/boot-files")
        return result

    def create_join_token(self, expires_in_s: int, uses: int) -> dict[str, Any]:
        body = {"expires_in_s": expires_in_s, "uses": uses}
        result: dict[str, Any] = self._call("POST", "/api/v1/tokens/join", json=body)
        return result

    def list_audit(self, since: datetime | None, actor: str | None, limit: int) -> list[dict[str, Any]]:
        params: dict[str, str | int] = {"limit": limit}
        if since is not None:
            params["since"] = since.isoformat()
        if actor is not None:
            params["actor"] = actor
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/audit", params=params)
        return result

    def search_logs(self, **filters: Any) -> list[dict[str, Any]]:
        """GET /api/v1/logs with the filters that are set (node, since, until, severity, kind, events, q, limit)."""
        params = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in filters.items() if v is not None}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/logs", params=params)
        return result

    def log_templates(self, category: str | None = None, new: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"new": new} | ({"category": category} if category is not None else {})
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/logs/templates", params=params)
        return result

    def import_advisories(self, advisories: list[dict[str, Any]]) -> dict[str, int]:
        result: dict[str, int] = self._call("POST", "/api/v1/cve/advisories", json={"advisories": advisories})
        return result

    def cve_report(self, **filters: Any) -> list[dict[str, Any]]:
        """GET /api/v1/cve/report with the filters that are set (severity, status, node, problem)."""
        params = {k: v for k, v in filters.items() if v is not None}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/cve/report", params=params)
        return result

    def cve_findings(self, node: str, status: list[str] | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"node": node} | ({"status": status} if status else {})
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/cve/findings", params=params)
        return result

    def set_finding_status(self, finding_id: int, status: str, reason: str | None) -> dict[str, Any]:
        body = {"status": status, "reason": reason}
        result: dict[str, Any] = self._call("PATCH", f"/api/v1/cve/findings/{finding_id}", json=body)
        return result

    def node_software(self, node: str, ecosystem: str | None = None) -> dict[str, Any]:
        params = {"ecosystem": ecosystem} if ecosystem else None
        result: dict[str, Any] = self._call("GET", f"/api/v1/assets/nodes/{node}", params=params)
        return result

    def software_diff(self, a: str, b: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/assets/diff", params={"a": a, "b": b})
        return result

    def software_where(self, package: str, versions: str | None, ecosystem: str | None) -> list[dict[str, Any]]:
        params = {k: v for k, v in {"package": package, "versions": versions, "ecosystem": ecosystem}.items() if v}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/assets/where", params=params)
        return result

    def software_matrix(self) -> dict[str, dict[str, list[str]]]:
        result: dict[str, dict[str, list[str]]] = self._call("GET", "/api/v1/assets/matrix")
        return result

    def software_drift(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/assets/drift")
        return result

    def create_user_token(self, user: str, expires_in_s: int, scope: str) -> dict[str, Any]:
        body = {"user": user, "expires_in_s": expires_in_s, "scope": scope}
        result: dict[str, Any] = self._call("POST", "/api/v1/tokens/user", json=body)
        return result

    def revoke_token(self, token_id: int) -> None:
        self._call("DELETE", f"/api/v1/tokens/{token_id}")

    def list_users(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/users")
        return result

    def show_user(self, username: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/users/{username}")
        return result

    def create_user(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/users", json=spec)
        return result

    def update_user(self, username: str, change: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PATCH", f"/api/v1/users/{username}", json=change)
        return result

    def directory_status(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/directory")
        return result

    def directory_sync(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/directory/sync")
        return result

    def delete_user(self, username: str) -> None:
        self._call("DELETE", f"/api/v1/users/{username}")

    def list_projects(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/projects")
        return result

    def show_project(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/projects/{name}")
        return result

    def create_project(self, name: str, description: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/projects", json={"name": name, "description": description})
        return result

    def add_project_member(self, name: str, user: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/projects/{name}/members", json={"user": user})
        return result

    def remove_project_member(self, name: str, user: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("DELETE", f"/api/v1/projects/{name}/members/{user}")
        return result

    def set_project_quota(self, name: str, quota: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PUT", f"/api/v1/projects/{name}/quota", json=quota)
        return result

    def list_tokens(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/tokens")
        return result

    def metrics(self, node: str, entity: str, metric: str, since: str, step: str | None) -> dict[str, Any]:
        params = {"entity": entity, "metric": metric, "since": since} | ({"step": step} if step else {})
        result: dict[str, Any] = self._call("GET", f"/api/v1/nodes/{node}/metrics", params=params)
        return result

    def fleet_health(self, names: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/health", params={"names": names} if names else None)
        return result

    def drain(self, node: str, reason: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{node}/drain", json={"reason": reason})
        return result

    def resume(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{node}/resume")
        return result

    def start_burnin(self, nodes: list[str], profile: str, resume: bool = True) -> list[dict[str, Any]]:
        body = {"nodes": nodes, "profile": profile, "resume": resume}
        result: list[dict[str, Any]] = self._call("POST", "/api/v1/burn-ins", json=body)
        return result

    def list_burnins(self, node: str | None = None, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        params: dict[str, Any] = (
            {"limit": limit} | ({"node": node} if node else {}) | ({"state": state} if state else {})
        )
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/burn-ins", params=params)
        return result

    def get_burnin(self, run_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/burn-ins/{run_id}")
        return result

    def cancel_burnin(self, run_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/burn-ins/{run_id}/cancel")
        return result

    def burnin_fleet(self, step: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call(
            "GET", "/api/v1/burn-ins/fleet", params={"step": step} if step else {}
        )
        return result

    def burnin_held(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/burn-ins/held")
        return result

    def burnin_profiles(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/burn-in-profiles")
        return result

    def fault(self, node: str, action: str, kind: str | None, gpu: int | None) -> dict[str, Any]:
        body = {"action": action, "kind": kind, "gpu": gpu}
        result: dict[str, Any] = self._call("POST", f"/api/v1/nodes/{node}/faults", json=body)
        return result

    def slurm_config(self, default_partition: str) -> dict[str, Any]:
        """slurm.conf's node and partition lines and a gres.conf, rendered from the inventory."""
        params = {"default_partition": default_partition}
        result: dict[str, Any] = self._call("GET", "/api/v1/slurm/config", params=params)
        return result

    def sync_slurm_accounts(self, dry_run: bool) -> dict[str, Any]:
        """Bring Slurm's accounts in line with the projects (or, dry, say how)."""
        params = {"dry_run": str(dry_run).lower()}
        result: dict[str, Any] = self._call("POST", "/api/v1/slurm/accounts/sync", params=params)
        return result

    def list_alerts(self, status: str | None, node: str | None) -> list[dict[str, Any]]:
        params = {k: v for k, v in {"status": status, "node": node}.items() if v is not None}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/alerts", params=params)
        return result

    def ack_alert(self, alert_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/alerts/{alert_id}/ack")
        return result

    def add_silence(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/silences", json=spec)
        return result

    def list_silences(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/silences")
        return result

    def add_receiver(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/alert-receivers", json=spec)
        return result

    def list_receivers(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/alert-receivers")
        return result

    def remove_receiver(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/alert-receivers/{name}")

    def list_alert_rules(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/alert-rules")
        return result

    def add_alert_rule(self, rule: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/alert-rules", json=rule)
        return result

    def remove_alert_rule(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/alert-rules/{name}")

    def list_health_policies(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/health-policies")
        return result

    def set_health_policy(self, category: str, policy: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PUT", f"/api/v1/health-policies/{category}", json=policy)
        return result

    def remove_health_policy(self, category: str) -> None:
        self._call("DELETE", f"/api/v1/health-policies/{category}")

    # -- categories and node settings (defaults < category < node) --------------------------------
    def create_category(self, name: str, description: str, settings: dict[str, Any]) -> dict[str, Any]:
        body = {"name": name, "description": description, "settings": settings}
        result: dict[str, Any] = self._call("POST", "/api/v1/categories", json=body)
        return result

    def list_categories(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/categories")
        return result

    def show_category(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/categories/{name}")
        return result

    def update_category(
        self, name: str, set_: dict[str, Any], unset: list[str], description: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"set": set_, "unset": unset}
        if description is not None:
            body["description"] = description
        result: dict[str, Any] = self._call("PATCH", f"/api/v1/categories/{name}", json=body)
        return result

    def remove_category(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/categories/{name}")

    def add_environment(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/environments", json=body)
        return result

    def list_environments(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/environments")
        return result

    def show_environment(self, ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/environments/{quote(ref, safe=':')}")
        return result

    def check_environment(self, ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/environments/{quote(ref, safe=':')}/check")
        return result

    def remove_environment(self, ref: str) -> None:
        self._call("DELETE", f"/api/v1/environments/{quote(ref, safe=':')}")

    def register_artifact(self, kinds: str, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/{kinds}", json=body)
        return result

    def list_artifacts(self, kinds: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/api/v1/{kinds}")
        return result

    def show_artifact(self, kinds: str, ref: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/{kinds}/{quote(ref, safe=':')}")
        return result

    def remove_artifact(self, kinds: str, ref: str) -> None:
        self._call("DELETE", f"/api/v1/{kinds}/{quote(ref, safe=':')}")

    def create_service(self, body: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/services", json=body)
        return result

    def list_services(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/services")
        return result

    def show_service(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/services/{quote(name, safe='')}")
        return result

    def scale_service(self, name: str, replicas: int) -> dict[str, Any]:
        path = f"/api/v1/services/{quote(name, safe='')}/scale"
        result: dict[str, Any] = self._call("POST", path, json={"replicas": replicas})
        return result

    def update_service(self, name: str, change: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/services/{quote(name, safe='')}/update", json=change)
        return result

    def delete_service(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/services/{quote(name, safe='')}")

    def service_logs(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/services/{quote(name, safe='')}/logs")
        return result

    def list_templates(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/api/v1/templates")
        return result

    def show_template(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/templates/{quote(name, safe='')}")
        return result

    def render_template(self, name: str, values: dict[str, str]) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", f"/api/v1/templates/{quote(name, safe='')}/render", json={"values": values}
        )
        return result

    def update_node_settings(
        self, name: str, set_: dict[str, Any], unset: list[str], category: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"set": set_, "unset": unset} | ({"category": category} if category is not None else {})
        result: dict[str, Any] = self._call("PATCH", f"/api/v1/nodes/{name}/settings", json=body)
        return result

    # -- Ansible: the dynamic inventory and playbook runs (tasks) -----------------------------------
    def ansible_inventory(self, host: str | None = None) -> dict[str, Any]:
        params = {"host": host} if host is not None else {}
        result: dict[str, Any] = self._call("GET", "/api/v1/ansible/inventory", params=params)
        return result

    def ansible_plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/ansible/plans", json=spec)
        return result

    def ansible_run(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/ansible/runs", json=spec)
        return result

    def agent_deploy_plan(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/agent-deploys/plans", json=spec)
        return result

    def agent_deploy(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/agent-deploys", json=spec)
        return result

    # -- software images and image sync (tasks) --------------------------------------------------------
    def list_images(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/images")
        return result

    def get_image(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/images/{name}")
        return result

    def create_image(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/images", json=spec)
        return result

    def plan_image_change(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/images/plans", json=spec)
        return result

    def clone_image(self, name: str, new_name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/images/{name}/clone", json={"name": new_name})
        return result

    def install_into_image(self, name: str, packages: list[str]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/images/{name}/install", json={"packages": packages})
        return result

    def remove_image(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/images/{name}")

    def sync_images(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/sync", json=spec)
        return result

    def node_drift(self, node: str, image: str | None = None, target: str | None = None) -> dict[str, Any]:
        params = {k: v for k, v in (("image", image), ("target", target)) if v is not None}
        # rsync --checksum reads every file of the image and the node: far longer than a usual call
        # (the head stops it after image_drift_timeout_s, at most 600 s)
        result: dict[str, Any] = self._call("GET", f"/api/v1/nodes/{node}/drift", params=params, timeout=660.0)
        return result

    # -- power: nodes' BMCs (the password goes up, never comes back) and power actions (tasks) ------
    def set_bmc(self, node: str, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("PUT", f"/api/v1/nodes/{node}/bmc", json=spec)
        return result

    def add_switch(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/switches", json=spec)
        return result

    def list_switches(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/switches")
        return result

    def get_switch(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/switches/{name}")
        return result

    def remove_switch(self, name: str) -> None:
        self._call("DELETE", f"/api/v1/switches/{name}")

    def node_links(self, node: str) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", f"/api/v1/nodes/{node}/links")
        return result

    def get_bmc(self, node: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/nodes/{node}/bmc")
        return result

    def remove_bmc(self, node: str) -> None:
        self._call("DELETE", f"/api/v1/nodes/{node}/bmc")

    def mig(self, node: str | None = None, category: str | None = None) -> list[dict[str, Any]]:
        """Each node's GPUs against its declared MIG layout (GET /api/v1/mig)."""
        params = {k: v for k, v in (("node", node), ("category", category)) if v is not None}
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/mig", params=params)
        return result

    def declare_mig(
        self, layout: str | None, *, node: str | None = None, category: str | None = None, now: bool = False
    ) -> list[dict[str, Any]]:
        """Declare (None: unset) a node's or category's MIG layout (PUT /api/v1/mig/layout)."""
        body = {"layout": layout, "node": node, "category": category, "now": now}
        result: list[dict[str, Any]] = self._call("PUT", "/api/v1/mig/layout", json=body)
        return result

    def storage(self, status: str | None = None) -> list[dict[str, Any]]:
        """The shared file systems' fleet view (GET /api/v1/storage)."""
        params = {"status": status} if status else None
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/storage", params=params)
        return result

    def power_states(self, nodes: str | None = None) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/power", params={"nodes": nodes} if nodes else None)
        return result

    def power_plan(self, action: str, request: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/power/plans", json={"action": action, **request})
        return result

    def power_action(self, action: str, request: dict[str, Any]) -> dict[str, Any]:
        """Start a power task (status, on, off, cycle, reset); returns the task to follow."""
        result: dict[str, Any] = self._call("POST", f"/api/v1/power/{action}", json=request)
        return result

    # -- jobs ---------------------------------------------------------------------------------------
    def submit_job(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/jobs", json=spec)
        return result

    def list_jobs(
        self,
        states: list[str],
        user: str | None,
        project: str | None,
        limit: int,
        *,
        expand: bool = False,
        array_job_id: int | None = None,
        array_task_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Jobs, a job array's pending tasks as one row unless `expand` (or `array_job_id`, one array's tasks)."""
        params: dict[str, Any] = {"limit": limit}
        if states:
            params["state"] = states
        if user is not None:
            params["user"] = user
        if project is not None:
            params["project"] = project
        if expand:
            params["expand"] = "true"
        if array_job_id is not None:
            params["array_job_id"] = array_job_id
        if array_task_id is not None:
            params["array_task_id"] = array_task_id
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/jobs", params=params)
        return result

    def show_job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/jobs/{job_id}")
        return result

    def cancel_job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", f"/api/v1/jobs/{job_id}/cancel")
        return result

    def cancel_job_array(self, array_job_id: int) -> dict[str, Any]:
        """Cancel every task of a job array not yet ended."""
        result: dict[str, Any] = self._call("POST", f"/api/v1/jobs/arrays/{array_job_id}/cancel")
        return result

    def job_output(self, job_id: int, after: int, rank: int | None) -> dict[str, Any]:
        params: dict[str, Any] = {"after": after}
        if rank is not None:
            params["rank"] = rank
        result: dict[str, Any] = self._call("GET", f"/api/v1/jobs/{job_id}/output", params=params)
        return result

    def usage_report(self, since: datetime, by: str) -> dict[str, Any]:
        params = {"since": since.isoformat(), "by": by}
        result: dict[str, Any] = self._call("GET", "/api/v1/reports/usage", params=params)
        return result

    def idle_gpus(self, below: float) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/reports/idle-gpus", params={"below": below})
        return result

    # -- maintenance campaigns ----------------------------------------------------------------------
    def plan_campaign(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/maintenance/plans", json=spec)
        return result

    def create_campaign(self, spec: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = self._call("POST", "/api/v1/maintenance/campaigns", json=spec)
        return result

    def list_campaigns(self, limit: int = 100) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("GET", "/api/v1/maintenance/campaigns", params={"limit": limit})
        return result

    def show_campaign(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", f"/api/v1/maintenance/campaigns/{quote(name, safe='')}")
        return result

    def campaign_action(self, name: str, verb: str) -> dict[str, Any]:
        """pause, resume or cancel a campaign; returns it as it is now."""
        result: dict[str, Any] = self._call("POST", f"/api/v1/maintenance/campaigns/{quote(name, safe='')}/{verb}")
        return result


class AgentHttp:
    """The agent's HTTP calls. Shares one AsyncClient, so a simulator's thousand agents share a pool."""

    def __init__(self, server: str, http: httpx.AsyncClient) -> None:
        self.server = server.rstrip("/")
        self._http = http

    async def _call(
        self, method: str, path: str, token: str, extra_headers: dict[str, str] | None = None, **kwargs: Any
    ) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **(extra_headers or {})}
        try:
            response = await self._http.request(method, self.server + path, headers=headers, timeout=TIMEOUT, **kwargs)
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the head node at {self.server}: {exc!r}") from None
        raise_for(response)
        return response

    async def join(self, join_token: str, name: str, inventory: NodeInventory | None) -> JoinResponse:
        body = JoinRequest(name=name, inventory=inventory).model_dump(mode="json")
        response = await self._call("POST", "/api/v1/agent/join", join_token, json=body)
        return JoinResponse.model_validate(response.json())

    async def put_inventory(self, credential: str, inventory: NodeInventory) -> None:
        await self._call(
            "PUT",
            "/api/v1/agent/inventory",
            credential,
            content=inventory.model_dump_json(),
            extra_headers={"Content-Type": "application/json"},
        )

    async def put_software(self, credential: str, report: SoftwareInventory) -> None:
        await self._call(
            "PUT",
            "/api/v1/agent/software",
            credential,
            content=report.model_dump_json(),
            extra_headers={"Content-Type": "application/json"},
        )

    async def put_fabric(self, credential: str, fabric: IbFabric) -> None:
        """Send the InfiniBand fabric this node's ibnetdiscover sees. Raises PayloadTooLarge for one beyond
        the head's MAX_FABRIC_BYTES, Unavailable when the head cannot be reached."""
        await self._call(
            "PUT",
            "/api/v1/agent/fabric",
            credential,
            content=fabric.model_dump_json(),
            extra_headers={"Content-Type": "application/json"},
        )

    async def get_accounts(self, credential: str, etag: str | None) -> AccountList | None:
        """The cluster users' accounts, or None if they still have version `etag` (the head answers 304).

        Raises Unavailable when the head cannot be reached or answers with a list this agent cannot read,
        and the error tree's class (Unauthorized, Forbidden, ...) when it refuses.
        """
        headers = {"Authorization": f"Bearer {credential}"}
        if etag is not None:
            headers["If-None-Match"] = f'"{etag}"'
        try:
            response = await self._http.get(self.server + "/api/v1/agent/accounts", headers=headers, timeout=TIMEOUT)
        except httpx.HTTPError as exc:
            raise Unavailable(f"cannot reach the head node at {self.server}: {exc!r}") from None
        if response.status_code == 304:  # not a success to raise_for, but exactly what we asked for
            return None
        raise_for(response)
        try:
            return AccountList.model_validate_json(response.content)
        except ValidationError as exc:
            raise Unavailable(f"the head sent an account list this agent cannot read: {describe(exc)}") from None
