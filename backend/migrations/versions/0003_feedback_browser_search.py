"""feedback, the session browser's columns and indexes, full-text search over messages

* ``feedback``: one row per (session, turn or file, author) -- a turn's
  rating (up/down) or a changed file's verdict (keep/revert), with a comment.
* ``sessions`` gains ``policy_name`` (the policy's kind and model, filled in
  from ``policy`` for existing rows) and the feedback counts
  (``feedback_up``, ``feedback_down``, ``files_kept``, ``files_reverted``),
  plus indexes for keyset pages: (created_at, id), (owner, created_at, id),
  policy_name, parent_id.
* Full-text search over user and assistant messages, by dialect, kept up to
  date by a trigger on ``events`` (so the event writer's code is unchanged)
  and filled from the existing events here:

  - SQLite: an FTS5 table ``message_fts(text)``, tokenizer ``unicode61
    remove_diacritics 2``, a 3-character prefix index, whose rowid is ``num << 32 | seq``: ``num`` numbers
    the sessions in the order they were recorded (``message_fts_sessions``,
    filled by a trigger on ``sessions``), so matches come out session by
    session, newest first, and a page stops reading early;
  - PostgreSQL: ``message_search(session_id, seq, tsv)`` with a GIN index,
    ``tsv = to_tsvector('simple', text)`` after ASCII punctuation became
    spaces (so ``stats.py`` is the words ``stats`` and ``py``, as FTS5 splits
    it). The trigger swallows its own errors: a message that cannot be indexed
    (e.g. a NUL the json type refuses) is stored, just not searchable.

  Both index the first 100,000 characters of a message. A later migration
  that recreates ``sessions`` or ``events`` (an Alembic batch copy on SQLite)
  drops their triggers with the old table and must create them again.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-05 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

MESSAGE_TYPES = "('user_message', 'assistant_message')"
MAX_INDEXED_CHARS = 100_000
PG_PUNCT = r"""'[][!"#$%&''()*+,./:;<=>?@\\^_`{|}~-]+'"""  # ASCII punctuation, as a POSIX bracket expression

SQLITE_FTS = [
    # every session gets a number in the order it was recorded; a message's search rowid is
    # num << 32 | seq, so matches come out session by session, newest first, and stop early
    "CREATE TABLE message_fts_sessions (num INTEGER PRIMARY KEY, session_id VARCHAR(32) NOT NULL UNIQUE)",
    "INSERT INTO message_fts_sessions (session_id) SELECT id FROM sessions ORDER BY created_at, id",
    """CREATE TRIGGER sessions_message_fts AFTER INSERT ON sessions
    BEGIN
        INSERT INTO message_fts_sessions (session_id) VALUES (new.id);
    END""",
    "CREATE VIRTUAL TABLE message_fts USING fts5(text, prefix='3', tokenize='unicode61 remove_diacritics 2')",
    f"""CREATE TRIGGER events_message_fts AFTER INSERT ON events
    WHEN new.type IN {MESSAGE_TYPES} AND json_valid(new.body)
    BEGIN
        INSERT INTO message_fts (rowid, text)
        SELECT (num << 32) | new.seq, substr(json_extract(new.body, '$.text'), 1, {MAX_INDEXED_CHARS})
        FROM message_fts_sessions WHERE session_id = new.session_id;
    END""",
    f"""INSERT INTO message_fts (rowid, text)
    SELECT (n.num << 32) | e.seq, substr(json_extract(e.body, '$.text'), 1, {MAX_INDEXED_CHARS})
    FROM events e JOIN message_fts_sessions n ON n.session_id = e.session_id
    WHERE e.type IN {MESSAGE_TYPES} AND json_valid(e.body)""",
]

PG_TSV = f"to_tsvector('simple', regexp_replace(left(BODY::json ->> 'text', {MAX_INDEXED_CHARS}), {PG_PUNCT}, ' ', 'g'))"
PG_FTS = [
    "CREATE TABLE message_search (session_id varchar(32) NOT NULL, seq integer NOT NULL, tsv tsvector NOT NULL, "
    "PRIMARY KEY (session_id, seq))",
    "CREATE INDEX ix_message_search_tsv ON message_search USING gin (tsv)",
    f"""CREATE FUNCTION fw_index_message() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        BEGIN
            INSERT INTO message_search (session_id, seq, tsv)
            VALUES (NEW.session_id, NEW.seq, {PG_TSV.replace("BODY", "NEW.body")});
        EXCEPTION WHEN others THEN
            NULL;  -- the event is stored either way; only its search entry is missing
        END;
        RETURN NULL;
    END $$""",
    f"""CREATE TRIGGER events_message_search AFTER INSERT ON events FOR EACH ROW
    WHEN (NEW.type IN {MESSAGE_TYPES}) EXECUTE FUNCTION fw_index_message()""",
    f"""INSERT INTO message_search (session_id, seq, tsv)
    SELECT session_id, seq, {PG_TSV.replace("BODY", "body")} FROM events
    WHERE type IN {MESSAGE_TYPES} AND position('\\u0000' in body) = 0
    ON CONFLICT DO NOTHING""",
]


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('policy_name', sa.String(length=300), nullable=False, server_default=''))
        for column in ('feedback_up', 'feedback_down', 'files_kept', 'files_reverted'):
            batch_op.add_column(sa.Column(column, sa.Integer(), nullable=False, server_default='0'))
        batch_op.create_index('ix_sessions_created_id', ['created_at', 'id'], unique=False)
        batch_op.create_index('ix_sessions_owner_created', ['owner', 'created_at', 'id'], unique=False)
        batch_op.create_index('ix_sessions_policy_name', ['policy_name'], unique=False)
        batch_op.create_index('ix_sessions_parent', ['parent_id'], unique=False)
    _fill_policy_names()

    op.create_table('feedback',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('session_id', sa.String(length=32), nullable=False),
    sa.Column('key', sa.String(length=80), nullable=False),
    sa.Column('target', sa.String(length=8), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=True),
    sa.Column('path', sa.Text(), nullable=True),
    sa.Column('rating', sa.String(length=8), nullable=True),
    sa.Column('verdict', sa.String(length=8), nullable=True),
    sa.Column('comment', sa.Text(), nullable=False),
    sa.Column('author', sa.String(length=200), nullable=False),
    sa.Column('seq', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('updated_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['session_id'], ['sessions.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('session_id', 'key', 'author', name='uq_feedback_what_who')
    )
    op.create_index('ix_feedback_created', 'feedback', ['created_at'], unique=False)

    for statement in SQLITE_FTS if _dialect() == 'sqlite' else PG_FTS:
        op.execute(statement)


def downgrade() -> None:
    if _dialect() == 'sqlite':
        op.execute("DROP TRIGGER IF EXISTS events_message_fts")
        op.execute("DROP TRIGGER IF EXISTS sessions_message_fts")
        op.execute("DROP TABLE IF EXISTS message_fts")
        op.execute("DROP TABLE IF EXISTS message_fts_sessions")
    else:
        op.execute("DROP TRIGGER IF EXISTS events_message_search ON events")
        op.execute("DROP FUNCTION IF EXISTS fw_index_message()")
        op.execute("DROP TABLE IF EXISTS message_search")
    op.drop_index('ix_feedback_created', table_name='feedback')
    op.drop_table('feedback')
    # plain DROP COLUMN (SQLite >= 3.35), as in 0002: a batch copy of ``sessions`` is refused by the events' keys
    for index in ('ix_sessions_parent', 'ix_sessions_policy_name', 'ix_sessions_owner_created', 'ix_sessions_created_id'):
        op.drop_index(index, table_name='sessions')
    for column in ('files_reverted', 'files_kept', 'feedback_down', 'feedback_up', 'policy_name'):
        op.drop_column('sessions', column)


def _dialect() -> str:
    return op.get_bind().dialect.name


def _fill_policy_names() -> None:
    """``policy_name`` for the sessions that exist (new ones get it when created)."""
    from backend.db.models import policy_label

    sessions = sa.table('sessions', sa.column('id', sa.String), sa.column('policy', sa.JSON),
                        sa.column('policy_name', sa.String))
    bind = op.get_bind()
    rows = bind.execute(sa.select(sessions.c.id, sessions.c.policy)).all()
    for sid, policy in rows:
        label = policy_label(policy if isinstance(policy, dict) else {})
        bind.execute(sa.update(sessions).where(sessions.c.id == sid).values(policy_name=label))
