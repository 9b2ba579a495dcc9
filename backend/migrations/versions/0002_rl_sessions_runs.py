"""RL rollouts in the session log: session tags, rl_runs, rl_iterations

Sessions gain ``kind`` ('user' | 'rl'; existing rows become 'user') and the
RL tags of a rollout (run, iteration, task, sample index, reward, status),
NULL for user sessions. ``rl_runs`` holds one row per training/eval run (its
config as JSON) and ``rl_iterations`` one row per (run, iteration) with that
iteration's metrics.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-02 10:00:00
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('kind', sa.String(length=8), nullable=False, server_default='user'))
        batch_op.add_column(sa.Column('rl_run', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('rl_iteration', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('rl_task', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('rl_sample', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('rl_reward', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('rl_status', sa.String(length=16), nullable=True))
        batch_op.create_index('ix_sessions_kind_created', ['kind', 'created_at'], unique=False)
        batch_op.create_index('ix_sessions_rl_rollout', ['rl_run', 'rl_iteration', 'rl_task', 'rl_sample'],
                              unique=False)

    op.create_table('rl_runs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('notes', sa.Text(), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('rl_iterations',
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('iteration', sa.Integer(), nullable=False),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['rl_runs.id'], ),
    sa.PrimaryKeyConstraint('run_id', 'iteration')
    )


def downgrade() -> None:
    op.drop_table('rl_iterations')
    op.drop_table('rl_runs')
    # plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35), not a batch table copy: copying would
    # drop and recreate ``sessions``, which the events' foreign keys refuse while sessions exist
    op.drop_index('ix_sessions_rl_rollout', table_name='sessions')
    op.drop_index('ix_sessions_kind_created', table_name='sessions')
    for column in ('rl_status', 'rl_reward', 'rl_sample', 'rl_task', 'rl_iteration', 'rl_run', 'kind'):
        op.drop_column('sessions', column)
