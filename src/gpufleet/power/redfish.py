"""A Redfish BMC through httpx: the ComputerSystem's PowerState and its ComputerSystem.Reset action.

Which ResetType an action sends is chosen from the BMC's own list (`ResetType@Redfish.AllowableValues`
on the action, or its `@Redfish.ActionInfo`), in an order of preference per action: BMCs differ (the
sushy emulator has no PowerCycle, many Dell and HPE BMCs have no plain On). When the BMC lists no
values, the first preference is sent and the BMC's answer decides.
"""

from __future__ import annotations

from typing import Any

import httpx

from gpufleet.power.ports import BmcError, BmcTarget, PowerState

SYSTEMS = "/redfish/v1/Systems"
# The ResetTypes that do each action, best first.
ON = ("On", "ForceOn")
OFF = ("ForceOff", "GracefulShutdown")
CYCLE = ("PowerCycle", "ForceRestart", "GracefulRestart")
RESET = ("ForceRestart", "GracefulRestart", "PowerCycle")
_STATES = {"On": PowerState.ON, "Off": PowerState.OFF}


def base_url(address: str) -> str:
    """The BMC's base URL: an address without a scheme is reached over HTTPS."""
    address = address.strip().rstrip("/")
    return address if address.startswith(("http://", "https://")) else f"https://{address}"


class RedfishClient:
    """One BMC's one system. Short-lived: made for one action on one node, then closed."""

    def __init__(self, target: BmcTarget, *, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None):
        self._url = base_url(target.address)
        self._system_id = target.system_id
        self._system_path: str | None = None
        self._http = httpx.Client(
            base_url=self._url,
            auth=httpx.BasicAuth(target.username, target.password),
            verify=target.verify_tls,
            timeout=httpx.Timeout(timeout_s),
            follow_redirects=True,
            headers={"Accept": "application/json", "OData-Version": "4.0"},
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RedfishClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # The BmcClient protocol
    def power_state(self) -> PowerState:
        raw = self._system().get("PowerState")
        return _STATES.get(str(raw), PowerState.UNKNOWN)

    def power_on(self) -> None:
        self._reset(ON)

    def power_off(self) -> None:
        self._reset(OFF)

    def power_cycle(self) -> None:
        self._reset(CYCLE)

    def reset(self) -> None:
        self._reset(RESET)

    # What the BMC offers
    def system_path(self) -> str:
        """The system's path: the configured id, else the only member of /Systems.

        Raises BmcError when there is no system, or several and none was named.
        """
        if self._system_path is not None:
            return self._system_path
        if self._system_id:
            self._system_path = f"{SYSTEMS}/{self._system_id}"
            return self._system_path
        members = self._get(SYSTEMS).get("Members") or []
        paths = [str(m.get("@odata.id", "")) for m in members if isinstance(m, dict)]
        if len(paths) != 1 or not paths[0]:
            ids = ", ".join(p.rsplit("/", 1)[-1] for p in paths[:5]) + (", ..." if len(paths) > 5 else "")
            raise BmcError(f"{self._url} has {len(paths)} systems ({ids or 'none'}): set the node's Redfish system id")
        self._system_path = paths[0]
        return self._system_path

    def allowed_reset_types(self) -> tuple[str, list[str] | None]:
        """The Reset action's target and the ResetTypes the BMC allows (None: it does not say)."""
        action = (self._system().get("Actions") or {}).get("#ComputerSystem.Reset")
        if not isinstance(action, dict) or not action.get("target"):
            raise BmcError(f"{self._url}: the system offers no ComputerSystem.Reset action")
        allowed = action.get("ResetType@Redfish.AllowableValues")
        if allowed is None and action.get("@Redfish.ActionInfo"):
            info = self._get(str(action["@Redfish.ActionInfo"]))
            for parameter in info.get("Parameters") or []:
                if isinstance(parameter, dict) and parameter.get("Name") == "ResetType":
                    allowed = parameter.get("AllowableValues")
        return str(action["target"]), [str(v) for v in allowed] if isinstance(allowed, list) else None

    def _reset(self, preferences: tuple[str, ...]) -> None:
        target, allowed = self.allowed_reset_types()
        if allowed is None:
            reset_type = preferences[0]
        else:
            chosen = [p for p in preferences if p in allowed]
            if not chosen:
                raise BmcError(
                    f"{self._url}: the BMC allows none of {', '.join(preferences)} (it allows {', '.join(allowed)})"
                )
            reset_type = chosen[0]
        self._request("POST", target, json={"ResetType": reset_type})

    def _system(self) -> dict[str, Any]:
        return self._get(self.system_path())

    def _get(self, path: str) -> dict[str, Any]:
        try:
            body = self._request("GET", path).json()
        except ValueError:
            raise BmcError(f"{self._url}{path}: the answer is not JSON") from None
        if not isinstance(body, dict):
            raise BmcError(f"{self._url}{path}: not a Redfish resource")
        return body

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise BmcError(f"{self._url}: no answer within the timeout") from None
        except httpx.HTTPError as exc:
            raise BmcError(f"{self._url}: {type(exc).__name__}: {exc}") from None
        if response.status_code == 401:
            raise BmcError(f"{self._url}: the BMC refused the credentials (HTTP 401)")
        if response.status_code >= 400:
            raise BmcError(f"{self._url}{path}: HTTP {response.status_code}: {_message(response)}")
        return response


def _message(response: httpx.Response) -> str:
    """The first message of a Redfish error body, or the start of whatever came back."""
    try:
        error = response.json().get("error", {})
        extended = error.get("@Message.ExtendedInfo") or []
        if extended and isinstance(extended[0], dict) and extended[0].get("Message"):
            return str(extended[0]["Message"])[:300]
        if error.get("message"):
            return str(error["message"])[:300]
    except (ValueError, AttributeError):
        pass
    return response.text.strip()[:200] or response.reason_phrase
