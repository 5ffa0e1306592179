"""Mining the stored log lines for templates, per node category, on the leader (see `templates`).

The miner reads `log_records` past its cursor in id order, a batch per pass, so every replica's lines
are mined once and a new leader carries on where the last one stopped: each category's drain3 state,
template rates and the cursor are written back in the same transaction as what the pass found. A
replica that finds the stored cursor moved since its own last write (another leader ran meanwhile)
reloads before mining.

A category's first `learning_s` only learns: the templates of a healthy fleet's ordinary noise are
recorded, not announced. After it, the first line of a template never seen becomes an event of kind
`log_template` (code: the template's id), found by `gpufleet events list` like any Xid.

Reading by id can miss a line whose transaction committed after a later id had been mined (two
replicas flushing at once on PostgreSQL). Such a line is still stored and searchable; it is only not
mined, which costs a template count, never a classified event.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Row, func, insert, select, update
from sqlalchemy.orm import Session

from gpufleet.inventory.models import Node
from gpufleet.logs.framing import frame
from gpufleet.logs.models import LogMiner, LogRecord, LogTemplate
from gpufleet.logs.templates import Burst, BurstDetector, TemplateSet

BATCH = 5000  # lines per pass: bounds how long one pass holds the interpreter
NEW_TEMPLATE_KIND = "log_template"


_Record = Row[int, int, float, str, str, str | None, str | None]  # id, node, ts, source, line, kind, category


@dataclass(frozen=True)
class MiningSettings:
    learning_s: float = 86_400.0
    window_s: float = 60.0
    burst_factor: float = 10.0
    burst_min: int = 50


@dataclass
class _Category:
    templates: TemplateSet
    bursts: BurstDetector
    started_at: float


@dataclass
class _Seen:
    template: str
    count: int
    first_seen: float
    first_node: int
    last_seen: float
    new: bool  # created in this pass
    learned: bool


@dataclass(frozen=True)
class CategoryBurst:
    category: str
    template: str
    burst: Burst


@dataclass(frozen=True)
class NewTemplateEvent:
    record_id: int
    node_id: int
    ts: float
    source: str
    line: str
    template_id: int

    def as_record(self) -> dict[str, object]:
        """The event as its log record now reads (what forwarding sends)."""
        return {
            "source": self.source,
            "line": self.line,
            "kind": NEW_TEMPLATE_KIND,
            "severity": "info",
            "code": self.template_id,
        }


@dataclass
class MiningPass:
    cursor: int
    seen: dict[tuple[str, int], _Seen] = field(default_factory=dict)
    events: list[NewTemplateEvent] = field(default_factory=list)  # the first lines of new templates
    bursts: list[CategoryBurst] = field(default_factory=list)
    touched: set[str] = field(default_factory=set)

    @property
    def new_templates(self) -> int:
        return sum(1 for s in self.seen.values() if s.new and not s.learned)


class TemplateMining:
    def __init__(self, settings: MiningSettings | None = None) -> None:
        self.settings = settings or MiningSettings()
        self._categories: dict[str, _Category] = {}
        self._cursor: int | None = None  # what this replica last wrote (None: load first)

    def forget(self) -> None:
        """Drop what is in memory (a write failed, or leadership moved): the next pass reloads."""
        self._categories, self._cursor = {}, None

    def _detector(self) -> BurstDetector:
        s = self.settings
        return BurstDetector(window_s=s.window_s, factor=s.burst_factor, min_count=s.burst_min)

    def read(self, session: Session) -> list[_Record]:
        stored = session.scalar(select(func.max(LogMiner.cursor)))
        if self._cursor is None or stored != self._cursor:
            self._categories = {}
            for miner in session.scalars(select(LogMiner)):
                bursts = self._detector()
                bursts.loads(miner.rates)
                self._categories[miner.category] = _Category(TemplateSet(miner.state), bursts, miner.started_at)
            self._cursor = stored or 0
        query = (
            select(
                LogRecord.id,
                LogRecord.node_id,
                LogRecord.ts,
                LogRecord.source,
                LogRecord.line,
                LogRecord.kind,
                Node.category,
            )
            .join(Node, Node.id == LogRecord.node_id)
            .where(LogRecord.id > self._cursor)
            .order_by(LogRecord.id)
            .limit(BATCH)
        )
        return list(session.execute(query).all())

    def mine(self, rows: list[_Record], now: float) -> MiningPass:
        if self._cursor is None:
            raise RuntimeError("read() before mine()")
        result = MiningPass(cursor=rows[-1][0] if rows else self._cursor)
        # Windows that ended before now close first: this pass's lines count in the window open now.
        for category, held in self._categories.items():
            changes = held.bursts.advance(now)
            if changes:
                result.touched.add(category)
                for change in changes:
                    template = held.templates.template(change.template_id)
                    result.bursts.append(CategoryBurst(category, template, change))
        fresh_after = now - 2 * self.settings.window_s
        for record_id, node_id, ts, source, line, kind, node_category in rows:
            category = node_category or ""
            cat = self._categories.get(category)
            if cat is None:
                cat = self._categories[category] = _Category(TemplateSet(), self._detector(), now)
            result.touched.add(category)
            mined = cat.templates.add(frame(line)[2])
            learning = now < cat.started_at + self.settings.learning_s
            key = (category, mined.template_id)
            seen = result.seen.get(key)
            if seen is None:
                seen = result.seen[key] = _Seen(mined.template, 0, ts, node_id, ts, mined.new, learning)
                if mined.new and not learning and kind is None:
                    result.events.append(NewTemplateEvent(record_id, node_id, ts, source, line, mined.template_id))
            seen.template, seen.count, seen.last_seen = mined.template, seen.count + 1, max(seen.last_seen, ts)
            if ts >= fresh_after:  # a backlog of old lines (an agent catching up) is no burst
                cat.bursts.count(mined.template_id, node_id)
        return result

    def write(self, session: Session, result: MiningPass) -> None:
        """Store a pass: templates, the records that became events, and the touched categories' state."""
        for (category, template_id), seen in result.seen.items():
            row = session.scalar(
                select(LogTemplate).where(LogTemplate.category == category, LogTemplate.template_id == template_id)
            )
            if row is None:
                session.add(
                    LogTemplate(
                        category=category,
                        template_id=template_id,
                        template=seen.template,
                        first_seen=seen.first_seen,
                        first_node_id=seen.first_node,
                        last_seen=seen.last_seen,
                        count=seen.count,
                        learned=seen.learned,
                    )
                )
            else:
                row.template, row.count = seen.template, row.count + seen.count
                row.last_seen = max(row.last_seen, seen.last_seen)
        for event in result.events:
            session.execute(
                update(LogRecord)
                .where(LogRecord.id == event.record_id, LogRecord.kind.is_(None))
                .values(kind=NEW_TEMPLATE_KIND, severity="info", code=event.template_id)
            )
        # Only categories this pass touched are written; the cursor is the largest stored one.
        stored = set(session.scalars(select(LogMiner.category)))
        for category in result.touched:
            cat = self._categories[category]
            cat.bursts.forget(cat.templates.ids())
            values = {"cursor": result.cursor, "state": cat.templates.snapshot(), "rates": cat.bursts.dumps()}
            if category in stored:
                session.execute(update(LogMiner).where(LogMiner.category == category).values(**values))
            else:
                session.execute(insert(LogMiner).values(category=category, started_at=cat.started_at, **values))
        session.flush()
        self._cursor = result.cursor


def templates(session: Session, category: str | None = None, new_only: bool = False) -> list[LogTemplate]:
    """Templates, most recently seen first; `new_only`: those found after their category's learning."""
    query = select(LogTemplate).order_by(LogTemplate.last_seen.desc())
    if category is not None:
        query = query.where(LogTemplate.category == category)
    if new_only:
        query = query.where(LogTemplate.learned.is_(False))
    return list(session.scalars(query))
