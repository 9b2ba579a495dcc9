"""The durable session log: SQLAlchemy 2.0 models, engine set-up, migrations."""
