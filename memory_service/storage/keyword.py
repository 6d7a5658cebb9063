"""Keyword search over a team's passages and active facts, with recall's filters inside the query.

SQLite: FTS5 finds the rows, bounded so a common word does not make it rank every row (the team's rarest
words first), and `team_bm25` ranks them. PostgreSQL: `tsvector @@ tsquery` over a GIN index, ranked with
`ts_rank_cd`. Both: a text is findable the moment its save commits.

Nothing another team stores may change a team's answer (ids, order, scores): every count that picks the
plan or ranks a row is the team's own (FTS5's `bm25()` and `fts5vocab` count every team's rows), and a
cache is keyed by team. At most `MAX_QUERY_WORDS` query words are used (`keyword_words`).
"""

from __future__ import annotations

import re
import sqlite3
import threading
import time
from functools import lru_cache
from typing import Any

from ..contract.limits import MAX_QUERY_WORDS
from ..contract.text import STOPWORDS
from . import team_bm25
from .database import Database
from .records import DELETED, KeywordHit, tags_of

# Keyword leg bounds (BM25 costs ~5-10 us a row, the join to the item as much): rows the rarest words may
# match before the rest must co-occur, rows ranked at most, and rows looked at when a filter skips some.
KEYWORD_RARE_ROWS = 250
KEYWORD_MAX_RANKED = 200
KEYWORD_MAX_SCANNED = 1000
KEYWORD_AGENT_SET_ROWS = 5000  # an agent with at most this many rows is filtered as a set of rowids
DOC_FREQ_TTL_S = 30.0  # document frequencies only bound the work: a slightly old count is fine

_FTS_TOKEN = re.compile(r"[\w]+", re.UNICODE)
_DIGIT = re.compile(r"\d")
_PLAIN_TAG = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]+")  # printable ASCII but `"` and `\`


def fts_query(text: str) -> str | None:
    """Quote every content word, OR them: a free-text query must never be parsed as FTS syntax.

    Stopwords are left out: they match most rows, and BM25 must rank every row that matches.
    """
    words = fts_words(text)
    if not words:
        return None
    return " OR ".join(f'"{w}"' for w in words)


def fts_words(text: str) -> list[str]:
    """The query's content words, once each, in order."""
    return list(dict.fromkeys(w for w in _FTS_TOKEN.findall(text.lower()) if len(w) > 1 and w not in STOPWORDS))


def most_informative(words: list[str], keep: int = MAX_QUERY_WORDS) -> list[str]:
    """At most `keep` of `words`, in their order: those holding a digit (ids, numbers) first, then the longest.

    Chosen from the words alone, no index statistic: what another team stores cannot change the choice,
    and a 1,000-word query costs no look-up per word."""
    if len(words) <= keep:
        return words
    ranked = sorted(range(len(words)), key=lambda i: (_DIGIT.search(words[i]) is None, -len(words[i]), i))
    chosen = set(ranked[:keep])
    return [w for i, w in enumerate(words) if i in chosen]


def keyword_words(text: str) -> list[str]:
    """The query words the keyword search uses: its content words, bounded (`most_informative`)."""
    return most_informative(fts_words(text))


class PorterStems:
    """The index terms the FTS tokenizer makes of a word (its porter stems), to look them up in fts5vocab.

    Asks SQLite's own tokenizer, so the terms match the index exactly. Its in-memory connection opens on
    first use (importing opens nothing) and belongs to the journal that holds this object.
    """

    def __init__(self) -> None:
        self._conn: sqlite3.Connection | None = None
        self._lock = threading.Lock()
        self.of = lru_cache(maxsize=8192)(self._terms)

    def _terms(self, word: str) -> tuple[str, ...]:
        with self._lock:
            if self._conn is None:
                self._conn = sqlite3.connect(":memory:", check_same_thread=False)
                self._conn.executescript(
                    "CREATE VIRTUAL TABLE t USING fts5(x, tokenize='porter unicode61');"
                    "CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance');"
                )
            self._conn.execute("INSERT INTO t(rowid, x) VALUES (1, ?)", (word,))
            terms = tuple(row[0] for row in self._conn.execute("SELECT term FROM v ORDER BY offset"))
            self._conn.execute("DELETE FROM t")
        return terms

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def json_items(dialect: str, column: str, alias: str) -> str:
    """A FROM item listing the strings of a JSON array column as `alias.value`."""
    if dialect == "postgresql":
        return f"json_array_elements_text({column}::json) AS {alias}(value)"
    return f"json_each({column}) AS {alias}"


def has_tag(dialect: str, column: str) -> str:
    """A condition: the JSON array in `column` holds the tag given as the next parameter."""
    return f"EXISTS (SELECT 1 FROM {json_items(dialect, column, 'tag_')} WHERE tag_.value = ?)"


def _item_filter(
    kind: str,
    agent_id: str | None,
    tags: tuple[str, ...],
    since: float | None,
    until: float | None,
    dialect: str = "sqlite",
) -> tuple[str, list[Any]]:
    """SQL conditions (on alias `t`) for recall's filters; a passage must also not be forgotten."""
    where: list[str] = []
    args: list[Any] = []
    if kind == "passage":
        where.append("t.status != ?")
        args.append(DELETED)
    else:
        where.append("t.superseded_by IS NULL")
    if agent_id is not None:
        where.append("t.agent_id = ?")
        args.append(agent_id)
    for tag in tags:
        if dialect == "sqlite" and _PLAIN_TAG.fullmatch(tag):
            # a substring test first, which json_each then confirms, so json_each runs only on rows that
            # may hold the tag (a small saving: 11.8 -> 11.0 ms p50 for a tag filter at 100k, where the
            # rows scanned cost the most). A printable ASCII tag without quote or backslash reads the
            # same in any JSON encoding of the array.
            where.append("instr(t.tags, ?) > 0")
            args.append(f'"{tag}"')
        where.append(has_tag(dialect, "t.tags"))
        args.append(tag)
    if since is not None:
        where.append("t.created_at >= ?")
        args.append(since)
    if until is not None:
        where.append("t.created_at <= ?")
        args.append(until)
    return "".join(" AND " + w for w in where), args


_SHOWN = "t.text, t.agent_id, t.created_at, t.tags"  # what recall shows of a hit, read with the match


def _hit(kind: str, row: Any, rank: float) -> KeywordHit:
    """A hit from (id, memory id, text, agent, created_at, tags, rank) as selected with `_SHOWN`."""
    return KeywordHit(kind, row[0], row[1], row[2], rank, row[3], float(row[4]), tags_of(row[5]))


def _joined(words: list[str], operator: str) -> str:
    """Quoted words joined by an FTS5 operator: each is a phrase, never FTS syntax."""
    return f" {operator} ".join(f'"{w}"' for w in words)


class KeywordSearch:
    """The journal's keyword leg (a mixin: it uses the journal's `db` and its document-frequency cache)."""

    db: Database
    _df_cache: dict[tuple[str, str], tuple[int, float]]
    _stems: PorterStems

    def keyword_search(
        self,
        team: str,
        query: str,
        *,
        kinds: set[str],
        limit: int,
        agent_id: str | None = None,
        tags: tuple[str, ...] = (),
        since: float | None = None,
        until: float | None = None,
    ) -> list[KeywordHit]:
        """BM25 over passages and active facts of one team, filters applied before the limit.

        Bounded: only rows holding one of the rarest query words, or every query word, are candidates
        (see `_bounded_match`); of those the newest `KEYWORD_MAX_RANKED` that pass the filters are ranked,
        looking at no more than the newest `KEYWORD_MAX_SCANNED`. Ranking every row that shares one common
        word with the query was the slowest part of recall at 100k facts.
        """
        words = keyword_words(query)
        if not words:
            return []
        with self.db.reading() as conn:
            if self.db.dialect == "postgresql":
                return self._keyword_postgres(conn, team, words, kinds, limit, agent_id, tags, since, until)
            try:
                return self._keyword_sqlite(conn, team, words, kinds, limit, agent_id, tags, since, until)
            except sqlite3.OperationalError as exc:
                # FTS5 opening its table on a reader can fail once while a writer commits (seen 1 run in 3 of
                # the full suite): a transient state of the file, so the same read is tried once more
                if "vtable constructor failed" not in str(exc):
                    raise
        time.sleep(0.01)
        with self.db.reading() as conn:
            return self._keyword_sqlite(conn, team, words, kinds, limit, agent_id, tags, since, until)

    def _keyword_sqlite(
        self,
        conn: Any,
        team: str,
        words: list[str],
        kinds: set[str],
        limit: int,
        agent_id: str | None,
        tags: tuple[str, ...],
        since: float | None,
        until: float | None,
    ) -> list[KeywordHit]:
        filtered = agent_id is not None or bool(tags) or since is not None or until is not None
        hits: list[KeywordHit] = []
        for kind, fts, table, cols in (
            ("passage", "memories_fts", "memories", "t.id, t.id, " + _SHOWN),
            ("fact", "facts_fts", "facts", "t.id, t.memory_id, " + _SHOWN),
        ):
            if kind not in kinds:
                continue
            match = self._bounded_match(conn, fts, table, team, words)
            where, args = _item_filter(kind, agent_id, tags, since, until)
            # CROSS JOIN keeps the FTS match as the outer loop: the planner may otherwise scan the
            # team's rows and probe the index per row (seconds); newest rows first when capped
            if agent_id is not None and self._agent_rows(conn, table, team, agent_id) <= KEYWORD_AGENT_SET_ROWS:
                # a minority agent's rows as a set, probed per match before any join: a set look-up per
                # match instead of a row read (a large agent's set would cost more to build than it saves)
                where += f" AND +{fts}.rowid IN (SELECT rowid FROM {table} WHERE team = ? AND agent_id = ?)"
                args += [team, agent_id]
            floor = self._scan_floor(conn, fts, table, team, match) if filtered else None
            if floor is not None:
                where += f" AND {fts}.rowid >= ?"
                args.append(floor)
            sql = (
                f"SELECT {cols}, {fts}.rowid FROM {fts} CROSS JOIN {table} t "
                f"ON t.rowid = {fts}.rowid WHERE {fts} MATCH ? AND t.team = ? {where} "
                f"ORDER BY {fts}.rowid DESC LIMIT ?"
            )
            rows = conn.execute(sql, (match, team, *args, KEYWORD_MAX_RANKED)).fetchall()
            hits += self._ranked(kind, words, rows, limit)
        return hits

    def _ranked(self, kind: str, words: list[str], rows: list[Any], limit: int) -> list[KeywordHit]:
        """The team's candidates by BM25 among themselves (`team_bm25`), best first (ties: newest first)."""
        prefixes = team_bm25.word_prefixes(words, [self._stems.of(w) for w in words])
        scored = team_bm25.scores(prefixes, [row[2] for row in rows])
        order = sorted(range(len(rows)), key=lambda i: (-scored[i], -int(rows[i][6])))[:limit]
        return [_hit(kind, rows[i], -scored[i]) for i in order]

    def _keyword_postgres(
        self,
        conn: Any,
        team: str,
        words: list[str],
        kinds: set[str],
        limit: int,
        agent_id: str | None,
        tags: tuple[str, ...],
        since: float | None,
        until: float | None,
    ) -> list[KeywordHit]:
        """The same contract on PostgreSQL: a `tsvector` column (English stemming) with a GIN index.

        Any query word matches; of the matching rows that pass the filters, the newest
        `KEYWORD_MAX_SCANNED` are ranked (`ts_rank_cd`), which bounds the work for common words.
        """
        query = " || ".join(["plainto_tsquery('english', ?)"] * len(words))
        hits: list[KeywordHit] = []
        for kind, table, cols in (
            ("passage", "memories", "t.id, t.id, " + _SHOWN),
            ("fact", "facts", "t.id, t.memory_id, " + _SHOWN),
        ):
            if kind not in kinds:
                continue
            where, args = _item_filter(kind, agent_id, tags, since, until, "postgresql")
            sql = (
                f"SELECT * FROM (SELECT {cols}, ts_rank_cd(t.tsv, q.q) AS r FROM {table} t, "
                f"(SELECT {query} AS q) q WHERE t.tsv @@ q.q AND t.team = ? {where} "
                f"ORDER BY t.rowid DESC LIMIT ?) AS c ORDER BY r DESC LIMIT ?"
            )
            for row in conn.execute(sql, (*words, team, *args, KEYWORD_MAX_SCANNED, limit)):
                hits.append(_hit(kind, row, -float(row[6])))
        return hits

    def _bounded_match(self, conn: Any, fts: str, table: str, team: str, words: list[str]) -> str:
        """The FTS5 expression that bounds how many rows get ranked.

        Words are taken rarest first (the team's document frequencies, `_team_doc_freq`) while together
        they match at most `KEYWORD_RARE_ROWS` of the team's rows; if that is every word, the plain OR of all words. Otherwise rows with
        one of those rare words OR with all the words the index holds: an id, a number or a name (rare) is
        never dropped, the common words still count in BM25 (they are phrases of the expression), and a
        query of common words ranks the rows that hold them all. A word no row holds ("long" in "how long
        did the deploy take") stays among the rare ones, so a text saved since its count was cached is
        found by it, but it is left out of the all-words group, which it would otherwise empty.
        """
        df = {w: self._team_doc_freq(conn, fts, table, team, w) for w in words}
        ordered = sorted(words, key=lambda w: df[w])
        rare: list[str] = []
        total = 0
        for word in ordered:
            if total + df[word] > KEYWORD_RARE_ROWS:
                break
            rare.append(word)
            total += df[word]
        if len(rare) == len(words):
            return _joined(words, "OR")
        # a word left out of `rare` is held by rows (a word no row holds adds nothing to the total)
        held = _joined([w for w in words if df[w] > 0], "AND")
        return f"{_joined(rare, 'OR')} OR ({held})" if rare else held

    def _scan_floor(self, conn: Any, fts: str, table: str, team: str, match: str) -> int | None:
        """The rowid of the team's `KEYWORD_MAX_SCANNED`-th newest match (None if fewer): a filter that keeps
        few rows must not make the search walk every match. The team's: another team's newer matches must
        not push this team's rows out."""
        row = conn.execute(
            f"SELECT {fts}.rowid FROM {fts} CROSS JOIN {table} t ON t.rowid = {fts}.rowid "
            f"WHERE {fts} MATCH ? AND t.team = ? ORDER BY {fts}.rowid DESC LIMIT 1 OFFSET ?",
            (match, team, KEYWORD_MAX_SCANNED - 1),
        ).fetchone()
        return None if row is None else int(row[0])

    def _agent_rows(self, conn: Any, table: str, team: str, agent_id: str) -> int:
        """How many rows of `table` the agent has (cached like document frequencies: it only picks a plan)."""
        now = time.monotonic()
        cached = self._df_cache.get((table, f"{team}\x00{agent_id}"))
        if cached is not None and now - cached[1] < DOC_FREQ_TTL_S:
            return cached[0]
        count = int(
            conn.execute(f"SELECT COUNT(*) FROM {table} WHERE team = ? AND agent_id = ?", (team, agent_id)).fetchone()[
                0
            ]
        )
        self._cache((table, f"{team}\x00{agent_id}"), count, now)
        return count

    def _team_doc_freq(self, conn: Any, fts: str, table: str, team: str, word: str) -> int:
        """The team's rows of `fts` holding `word`, counted up to `KEYWORD_RARE_ROWS + 1` (past it a word
        is common, whatever the count). Only the team's rows: another team's must not change the plan.

        Every team's count (`_doc_freq`) bounds it: a word no row holds costs no walk. Cached per team for
        `DOC_FREQ_TTL_S`: a count walks the word's matches, joined to their team."""
        now = time.monotonic()
        key = (fts, f"{team}\x00{word}")
        cached = self._df_cache.get(key)
        if cached is not None and now - cached[1] < DOC_FREQ_TTL_S:
            return cached[0]
        df = 0
        if self._doc_freq(conn, fts, word) > 0:
            df = int(
                conn.execute(
                    f"SELECT count(*) FROM (SELECT 1 FROM {fts} CROSS JOIN {table} t ON t.rowid = {fts}.rowid "
                    f"WHERE {fts} MATCH ? AND t.team = ? LIMIT ?)",
                    (f'"{word}"', team, KEYWORD_RARE_ROWS + 1),
                ).fetchone()[0]
            )
        self._cache(key, df, now)
        return df

    def _doc_freq(self, conn: Any, fts: str, word: str) -> int:
        """Rows of `fts` (all teams) holding `word`: only a bound for one team's count, never used as one.
        A phrase counts its rarest token. Not cached: a look-up costs ~0.5 ms at 100k rows."""
        counts = [
            conn.execute(f"SELECT doc FROM temp.{fts}_vocab WHERE term = ?", (term,)).fetchone()
            for term in self._stems.of(word)
        ]
        return min((int(c[0]) if c else 0 for c in counts), default=0)

    def _cache(self, key: tuple[str, str], value: int, now: float) -> None:
        """Keep a team's count; a full cache sheds its expired entries, then (still full) everything."""
        if len(self._df_cache) > 20_000:
            for old in [k for k, (_, at) in self._df_cache.items() if now - at >= DOC_FREQ_TTL_S]:
                del self._df_cache[old]
            if len(self._df_cache) > 20_000:
                self._df_cache.clear()
        self._df_cache[key] = (value, now)
