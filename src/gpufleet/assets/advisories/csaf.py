"""CSAF 2.0 advisories (https://docs.oasis-open.org/csaf/csaf/v2.0/csaf-v2.0.html) as `Advisory`.

One Advisory per entry of `vulnerabilities`: its id is the entry's CVE, else the document's tracking
id and the entry's position (`BSI-2022-0001#1`); its aliases are the tracking id (RHSA-2022:0011) and
the texts of its `ids`.

CSAF names products by id; what a product id stands for comes from the `product_tree`:

- a relationship (`7Server-7.6.AUS:telnet-1:0.17-65.el7_6.x86_64`) is a component on a platform: the
  platform's CPE (`cpe:/o:redhat:rhel_aus:7.6::server`) gives the ecosystem (`Red Hat`) and the release
  (the major version, `7`; an `el8` field for layered products such as OpenShift);
- a component is identified by its purl when it has one (`pkg:rpm/redhat/telnet@0.17-65.el7_6?epoch=1`
  is telnet `1:0.17-65.el7_6`), else by its RPM name-[epoch:]version-release.arch, else by its CPE or
  branch names; debuginfo and debugsource RPMs are left out (nobody runs them), the `.src` RPM names
  the same package as its main binary and the duplicate is dropped;
- a product no ecosystem can be named for (BSI's "CSAF Tools CVRF-CSAF-Converter 1.0.0-alpha", an
  OpenShift container image) becomes ecosystem `generic`, package its lower-cased product name
  (`cvrf-csaf-converter`, `openshift4/ose-metering-hive`), version as the tree gives it. No inventory
  reports `generic` software: such entries are kept for the report and match nothing.

`product_status` per product: `fixed` and `first_fixed` give a range fixed at the product's version;
`known_affected`, `first_affected` and `last_affected` give that exact version as affected (a
product without a version: every version, no fix); the other statuses give nothing. When one release
holds several fixed versions of a package (RHEL 7.6 AUS and 7.7 EUS are both release `7`), each is
its own Affected: a package is reported while any of them says it is affected.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from gpufleet.assets.advisories.nvd import ANY_VALUES, Cpe, parse_cpe
from gpufleet.assets.advisories.osv import CvssScore, best_cvss, cve_first, severity_from_word, shorten
from gpufleet.assets.records import ECOSYSTEMS, Advisory, Affected, Range, Severity

GENERIC = "generic"
FIXED_STATUSES = ("first_fixed", "fixed")
AFFECTED_STATUSES = ("first_affected", "known_affected", "last_affected")
RPM_ARCHES = frozenset(
    {"noarch", "src", "x86_64", "i386", "i686", "aarch64", "ppc64le", "ppc64", "s390x", "s390", "armv7hl"}
)
# name-[epoch:]version-release.arch: the name may hold dashes, version and release may not.
_NEVRA = re.compile(r"(?P<name>.+)-(?:(?P<epoch>\d+):)?(?P<version>[^-:]+)-(?P<release>[^-:]+)\.(?P<arch>\w+)")
_EL_TAG = re.compile(r"el(\d+)")
# A container image named by repository and tag: openshift4/ose-metering-hive:v4.6.0-2021...stream
_IMAGE = re.compile(r"(?P<repository>[a-z0-9][\w.-]*(?:/[\w.-]+)+):(?P<tag>\w[\w.+-]*)")

# A platform CPE's vendor -> the ecosystem of the packages installed on it.
PLATFORM_VENDORS = {"redhat": "Red Hat", "rocky": "Rocky Linux", "almalinux": "AlmaLinux"}
# purl types and namespaces -> ecosystems (rpm and deb purls say the distribution in the namespace).
PURL_TYPES = {"pypi": "PyPI", "npm": "npm", "golang": "Go", "cargo": "crates.io"}
PURL_DISTROS = {
    ("rpm", "redhat"): "Red Hat",
    ("rpm", "rocky"): "Rocky Linux",
    ("rpm", "almalinux"): "AlmaLinux",
    ("deb", "debian"): "Debian",
    ("deb", "ubuntu"): "Ubuntu",
}
# Debian and Ubuntu code names a deb purl's `distro` qualifier may give instead of a version.
DEB_CODENAMES = {
    "buster": "10",
    "bullseye": "11",
    "bookworm": "12",
    "trixie": "13",
    "trusty": "14.04",
    "xenial": "16.04",
    "bionic": "18.04",
    "focal": "20.04",
    "jammy": "22.04",
    "noble": "24.04",
}


@dataclass(frozen=True)
class Purl:
    """The parts of a package URL (https://github.com/package-url/purl-spec) a package is known by."""

    type: str
    namespace: str
    name: str
    version: str
    qualifiers: Mapping[str, str]


def parse_purl(text: str) -> Purl | None:
    """`pkg:type/namespace/name@version?qualifiers#subpath`, percent-decoded; None if not a purl."""
    if not text.startswith("pkg:"):
        return None
    rest = text[len("pkg:") :].split("#", 1)[0]
    rest, _, query = rest.partition("?")
    path, version = rest.rsplit("@", 1) if "@" in rest else (rest, "")
    segments = [unquote(s) for s in path.split("/") if s]
    if len(segments) < 2:
        return None
    pairs = (pair.split("=", 1) for pair in query.split("&") if "=" in pair)
    return Purl(
        type=segments[0].lower(),
        namespace="/".join(segments[1:-1]),
        name=segments[-1],
        version=unquote(version),
        qualifiers={key.lower(): unquote(value) for key, value in pairs},
    )


@dataclass(frozen=True)
class Component:
    """What a product id stands for: a package at a version, in an ecosystem and release when known.
    `ecosystem` None: an RPM whose distribution the platform must say."""

    package: str
    version: str | None
    ecosystem: str | None
    release: str | None = None
    rpm: bool = False


@dataclass(frozen=True)
class _Product:
    product_id: str
    name: str
    helper: Mapping[str, Any]
    path: tuple[tuple[str, str], ...]  # (category, name) of the branches above it, outermost first


def _major(version: str) -> str:
    return version.split(".", maxsplit=1)[0]


def _deb_release(distro: str) -> str | None:
    """`debian-12`, `ubuntu-22.04`, `bookworm`, `esm-infra-legacy/trusty` -> 12, 22.04, 12, 14.04."""
    word = distro.lower().rsplit("/", 1)[-1]
    if word in DEB_CODENAMES:
        return DEB_CODENAMES[word]
    found = re.search(r"\d+(?:\.\d+)?", word)
    return found.group(0) if found else None


def _el_release(text: str) -> str | None:
    """The RHEL major release an RPM release field is built for: `65.el7_6` -> 7."""
    found = _EL_TAG.search(text)
    return found.group(1) if found else None


def _distro_release(distro: str) -> str | None:
    """The major release of an rpm purl's distro qualifier: `rhel-8.6`, `el9` -> 8, 9."""
    found = _EL_TAG.search(distro) or re.search(r"(\d+)", distro)
    return found.group(1) if found else None


def _from_purl(purl: Purl) -> Component:
    if purl.type == "rpm":
        epoch = purl.qualifiers.get("epoch")
        version = f"{epoch}:{purl.version}" if epoch and purl.version and ":" not in purl.version else purl.version
        distro = purl.qualifiers.get("distro")
        release = _distro_release(distro) if distro else _el_release(purl.version)
        ecosystem = PURL_DISTROS.get((purl.type, purl.namespace.lower()))
        return Component(purl.name, version or None, ecosystem, release, rpm=True)
    if purl.type == "deb":
        ecosystem = PURL_DISTROS.get((purl.type, purl.namespace.lower()), GENERIC)
        release = _deb_release(purl.qualifiers.get("distro", "")) if ecosystem != GENERIC else None
        return Component(purl.name, purl.version or None, ecosystem, release)
    if purl.type in PURL_TYPES:
        # npm scopes and Go module paths are part of the package's name.
        name = f"{purl.namespace}/{purl.name}" if purl.namespace and purl.type in ("npm", "golang") else purl.name
        return Component(name, purl.version or None, PURL_TYPES[purl.type])
    return Component(purl.name.lower(), purl.version or None, GENERIC)


def _from_nevra(name: str) -> Component | None:
    found = _NEVRA.fullmatch(name)
    if found is None or found["arch"] not in RPM_ARCHES:
        return None
    epoch = f"{found['epoch']}:" if found["epoch"] else ""
    version = f"{epoch}{found['version']}-{found['release']}"
    return Component(found["name"], version, None, _el_release(found["release"]), rpm=True)


def _from_cpe(cpe: Cpe) -> Component:
    return Component(cpe.product, None if cpe.version in ANY_VALUES else cpe.version, GENERIC)


def _from_branches(product: _Product) -> Component | None:
    """A product named by its branches: product_name (or product_family) then product_version."""
    names = dict(product.path)
    package = names.get("product_name") or names.get("product_family")
    if package is None:
        return None
    return Component(package.lower(), names.get("product_version"), GENERIC)


def _identify(product: _Product) -> Component:
    """What a product (not a relationship) is, from the surest evidence it carries."""
    purl = parse_purl(str(product.helper.get("purl") or ""))
    if purl is not None:
        return _from_purl(purl)
    nevra = _from_nevra(product.name) or _from_nevra(product.product_id)
    if nevra is not None:
        return nevra
    cpe = parse_cpe(str(product.helper.get("cpe") or ""))
    if cpe is not None:
        return _from_cpe(cpe)
    if (image := _IMAGE.fullmatch(product.name)) is not None:
        return Component(image["repository"].lower(), image["tag"], GENERIC)
    return _from_branches(product) or Component(product.name.lower(), None, GENERIC)


@dataclass(frozen=True)
class Platform:
    """The distribution a relationship installs a component on."""

    ecosystem: str
    release: str | None
    operating_system: bool  # RHEL itself, not a product layered on it (OpenShift)


def _platform(product: _Product | None) -> Platform | None:
    cpe = parse_cpe(str(product.helper.get("cpe") or "")) if product else None
    ecosystem = PLATFORM_VENDORS.get(cpe.vendor) if cpe else None
    if cpe is None or ecosystem is None:
        return None
    operating_system = cpe.part == "o" or cpe.product == "enterprise_linux" or cpe.product.startswith("rhel")
    if operating_system and cpe.version not in ANY_VALUES:
        return Platform(ecosystem, _major(cpe.version), operating_system)
    el_tag = next((m.group(1) for f in cpe.fields if (m := _EL_TAG.fullmatch(f))), None)
    return Platform(ecosystem, el_tag, operating_system)


def _on_platform(component: Component, platform: Platform | None) -> Component:
    """A component as installed on a platform: RPMs take the platform's distribution and release; a
    bare package name on an operating system is that system's package (every version)."""
    if platform is None:
        return component
    if component.rpm:
        ecosystem = component.ecosystem or platform.ecosystem
        return Component(component.package, component.version, ecosystem, platform.release or component.release, True)
    if component.ecosystem == GENERIC and component.version is None and platform.operating_system:
        return Component(component.package, None, platform.ecosystem, platform.release)
    return component


def _final(component: Component) -> Component | None:
    """The component as reported: RPMs of no known distribution are generic; debug RPMs are dropped."""
    if component.rpm and ("-debuginfo" in component.package or component.package.endswith("-debugsource")):
        return None
    if component.ecosystem is None:
        # An RPM built for RHEL (release el7, el8, ...) without a platform to say so is still RHEL's.
        ecosystem = "Red Hat" if component.release else GENERIC
        return Component(component.package, component.version, ecosystem, component.release, True)
    if ECOSYSTEMS.get(component.ecosystem) == "rpm" and component.release:
        return Component(component.package, component.version, component.ecosystem, _major(component.release), True)
    return component


class ProductTree:
    """A CSAF product_tree, answering what each product id stands for."""

    def __init__(self, tree: Mapping[str, Any]) -> None:
        self.products: dict[str, _Product] = {}
        self.relationships: dict[str, tuple[str, str]] = {}
        self._components: dict[str, Component | None] = {}
        for product in _walk(_objects(tree.get("branches")), ()):
            self.products[product.product_id] = product
        for full in _objects(tree.get("full_product_names")):
            self._add(full, ())
        for relation in _objects(tree.get("relationships")):
            self._relate(relation)

    def _add(self, full: Mapping[str, Any], path: tuple[tuple[str, str], ...]) -> None:
        product = _product(full, path)
        if product is not None:
            self.products.setdefault(product.product_id, product)

    def _relate(self, relation: Mapping[str, Any]) -> None:
        full = relation.get("full_product_name")
        reference, platform = relation.get("product_reference"), relation.get("relates_to_product_reference")
        if isinstance(full, Mapping) and isinstance(reference, str) and isinstance(platform, str):
            self._add(full, ())
            self.relationships[str(full.get("product_id"))] = (reference, platform)

    def component(self, product_id: str) -> Component | None:
        """The package and version a product id stands for; None for an unknown id or a debug RPM."""
        if product_id not in self._components:
            self._components[product_id] = self._resolve(product_id)
        return self._components[product_id]

    def _resolve(self, product_id: str) -> Component | None:
        if product_id in self.relationships:
            reference, platform = self.relationships[product_id]
            component = self.products.get(reference)
            if component is None:
                return None
            return _final(_on_platform(_identify(component), _platform(self.products.get(platform))))
        product = self.products.get(product_id)
        return _final(_identify(product)) if product else None


def _objects(value: object) -> list[Mapping[str, Any]]:
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _product(full: Mapping[str, Any], path: tuple[tuple[str, str], ...]) -> _Product | None:
    product_id = full.get("product_id")
    if not isinstance(product_id, str):
        return None
    helper = full.get("product_identification_helper")
    return _Product(
        product_id, str(full.get("name") or product_id), helper if isinstance(helper, Mapping) else {}, path
    )


def _walk(branches: Iterable[Mapping[str, Any]], path: tuple[tuple[str, str], ...]) -> Iterator[_Product]:
    """Every product in a branch tree, any depth, with the branches above it."""
    for branch in branches:
        here = (*path, (str(branch.get("category")), str(branch.get("name"))))
        full = branch.get("product")
        product = _product(full, here) if isinstance(full, Mapping) else None
        if product is not None:
            yield product
        yield from _walk(_objects(branch.get("branches")), here)


def _status_ids(status: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    ids = [i for name in names for i in status.get(name) or () if isinstance(i, str)]
    return list(dict.fromkeys(ids))


def _fixed(components: Iterable[Component]) -> list[Affected]:
    return [
        Affected(
            ecosystem=str(c.ecosystem),
            package=c.package,
            release=c.release,
            ranges=(Range("ECOSYSTEM", (("introduced", "0"), ("fixed", c.version))),),
            fixed=c.version,
        )
        for c in components
        if c.version is not None  # a fix at no known version says nothing a version can be compared to
    ]


def _known_affected(components: Iterable[Component]) -> list[Affected]:
    """Affected versions gathered per package; a package without a version is affected at every one."""
    versions: dict[tuple[str, str, str | None], list[str]] = {}
    unversioned: list[Affected] = []
    for c in components:
        key = (str(c.ecosystem), c.package, c.release)
        if c.version is None:
            unversioned.append(Affected(*key, ranges=(Range("ECOSYSTEM", (("introduced", "0"),)),)))
        else:
            versions.setdefault(key, []).append(c.version)
    return [Affected(*key, versions=tuple(dict.fromkeys(found))) for key, found in versions.items()] + unversioned


def _affected(vulnerability: Mapping[str, Any], tree: ProductTree) -> tuple[Affected, ...]:
    status = vulnerability.get("product_status")
    if not isinstance(status, Mapping):
        return ()

    def components(names: Sequence[str]) -> list[Component]:
        found = (tree.component(product_id) for product_id in _status_ids(status, names))
        return [c for c in found if c is not None]

    entries = _fixed(components(FIXED_STATUSES)) + _known_affected(components(AFFECTED_STATUSES))
    return tuple(dict.fromkeys(entries))


def _score(vulnerability: Mapping[str, Any]) -> CvssScore | None:
    """The best CVSS score given for any product: from the vector, else the number as written."""
    cvss = [s[k] for s in _objects(vulnerability.get("scores")) for k in ("cvss_v3", "cvss_v2") if k in s]
    metrics = [m for m in cvss if isinstance(m, Mapping)]
    best = best_cvss(str(m["vectorString"]) for m in metrics if m.get("vectorString"))
    if best is not None:
        return best
    given = [m for m in metrics if isinstance(m.get("baseScore"), int | float)]
    top = max(given, key=lambda m: float(m["baseScore"]), default=None)
    if top is None:
        return None
    return CvssScore(
        0, float(top["baseScore"]), severity_from_word(top.get("baseSeverity")), str(top.get("vectorString"))
    )


def _severity(vulnerability: Mapping[str, Any], document: Mapping[str, Any]) -> tuple[Severity, CvssScore | None]:
    """CVSS first; else the vendor's impact rating (Red Hat's `Important`), else the document's."""
    cvss = _score(vulnerability)
    if cvss is not None and cvss.severity != "unknown":
        return cvss.severity, cvss
    impacts = [t.get("details") for t in _objects(vulnerability.get("threats")) if t.get("category") == "impact"]
    aggregate = document.get("aggregate_severity")
    words = [*impacts, aggregate.get("text") if isinstance(aggregate, Mapping) else None]
    return next((s for s in map(severity_from_word, words) if s != "unknown"), "unknown"), cvss


def _advisory(
    vulnerability: Mapping[str, Any], number: int, document: Mapping[str, Any], tree: ProductTree
) -> Advisory:
    tracking = document["tracking"]
    tracking_id = str(tracking["id"])
    cve = vulnerability.get("cve")
    own_id = cve if isinstance(cve, str) and cve else f"{tracking_id}#{number}"
    ids = [str(i.get("text")) for i in _objects(vulnerability.get("ids")) if i.get("text")]
    severity, cvss = _severity(vulnerability, document)
    return Advisory(
        id=own_id,
        aliases=cve_first([tracking_id, *ids], own_id),
        summary=shorten(str(vulnerability.get("title") or document.get("title") or "")),
        source="csaf",
        severity=severity,
        cvss_score=cvss.score if cvss else None,
        cvss_vector=cvss.vector if cvss else None,
        published=tracking.get("initial_release_date"),
        modified=tracking.get("current_release_date"),
        affected=_affected(vulnerability, tree),
    )


def parse_csaf(data: Mapping[str, Any]) -> list[Advisory]:
    """One Advisory per vulnerability of a CSAF 2.0 document; ValueError for a document that is not."""
    document = data.get("document") if isinstance(data, Mapping) else None
    if not isinstance(document, Mapping) or "csaf_version" not in document:
        raise ValueError("not a CSAF document: no 'document' with a 'csaf_version'")
    tracking = document.get("tracking")
    if not isinstance(tracking, Mapping) or not isinstance(tracking.get("id"), str):
        # A malformed document is a data error (ValueError) for the caller, whatever its Python type.
        raise ValueError("CSAF document without document.tracking.id")  # noqa: TRY004
    tree = data.get("product_tree")
    products = ProductTree(tree if isinstance(tree, Mapping) else {})
    vulnerabilities = _objects(data.get("vulnerabilities"))
    return [_advisory(v, number, document, products) for number, v in enumerate(vulnerabilities, start=1)]
