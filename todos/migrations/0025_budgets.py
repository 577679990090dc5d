"""Spend budgets (CONTRACT §18): ``budgets``, a limit in dollars and/or tokens on
what an endpoint, a queue or a group spends in an hour, a day or a calendar
month of the budget's time zone. What is spent is read from ``usage_ledger``.
"""

import django.db.models.functions.datetime
import uuid
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('todos', '0024_admission_lock_without_waiting'),
    ]

    operations = [
        migrations.CreateModel(
            name='Budget',
            fields=[
                ('id', models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ('endpoint_id', models.UUIDField()),
                ('scope', models.TextField(choices=[('endpoint', 'endpoint'), ('queue', 'queue'), ('group', 'group')])),
                ('queue', models.TextField(blank=True, null=True)),
                ('group', models.TextField(blank=True, db_column='group_key', null=True)),
                ('window', models.TextField(choices=[('hour', 'hour'), ('day', 'day'), ('month', 'month')], db_column='window_unit')),
                ('time_zone', models.TextField(db_default='UTC')),
                ('limit_usd', models.DecimalField(blank=True, decimal_places=6, max_digits=20, null=True)),
                ('limit_tokens', models.BigIntegerField(blank=True, null=True)),
                ('soft_percent', models.IntegerField(db_default=80)),
                ('action', models.TextField(choices=[('pause', 'pause'), ('reject_new', 'reject_new')], db_default='pause')),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                'db_table': 'budgets',
                'indexes': [models.Index(fields=['endpoint_id'], name='budgets_endpoint_idx')],
                'constraints': [models.CheckConstraint(condition=models.Q(('scope__in', ('endpoint', 'queue', 'group'))), name='budgets_scope_check'), models.CheckConstraint(condition=models.Q(('window__in', ('hour', 'day', 'month'))), name='budgets_window_check'), models.CheckConstraint(condition=models.Q(('action__in', ('pause', 'reject_new'))), name='budgets_action_check')],
            },
        ),
    ]
