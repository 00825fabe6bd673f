"""The job specification is declared once (core/jobspec.py): every surface that lists a job's
fields (the request parser, the OpenAPI schemas, the jobs table, the job rows and views, the
trace columns, the engine's Job) is derived from it, so a field added to a spec shows up in each,
and a migration is called for."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from jupyter_gpusched.core.jobs import Job
from jupyter_gpusched.core.jobspec import (
    FIELDS,
    JOB_ATTRIBUTES,
    REQUEST_FIELDS,
    TRACE_FIELDS,
    Column,
    JobSpec,
    declare,
    spec_fields,
)
from jupyter_gpusched.service.models import build_jobs_table, spec_columns
from jupyter_gpusched.service.openapi_requests import JOB_REQUEST, job_request_schema
from jupyter_gpusched.service.openapi_responses import JOB, view_fields
from jupyter_gpusched.service.records import (
    OWNER_VIEW,
    PUBLIC_VIEW,
    Extra,
    job_from_row,
    public_job,
    row_for,
    view_columns,
)
from jupyter_gpusched.service.requests import (
    JOB_FIELDS,
    RequestError,
    parse_job_request,
    request_fields,
)
from jupyter_gpusched.service.store import Store
from jupyter_gpusched.sim.trace import (
    OPTIONAL,
    REQUIRED,
    TraceJob,
    read_trace,
    trace_columns,
    write_trace,
)

STORED = [f for f in FIELDS if f.spec.column is not None]


@dataclass(frozen=True, kw_only=True)
class WiderSpec(JobSpec):
    """A throwaway spec: JobSpec and one more field, declared as any other."""

    gpu_memory_gb: float | None = declare(
        help="GPU memory on each GPU in GB (number from 0 to 1000)",
        parse="number",
        maximum=1000.0,
        column=Column("double"),
        trace=True,
    )


WIDER = spec_fields(WiderSpec)


# -- every spec field is in each surface today -------------------------------------------------
def test_the_request_parser_and_schema_list_exactly_the_specs_request_fields():
    wires = [f.wire for f in REQUEST_FIELDS]
    assert list(JOB_FIELDS) == wires
    assert set(JOB_REQUEST["properties"]) == set(wires)
    assert JOB_REQUEST["required"] == ["gpus"]
    for spec_field in REQUEST_FIELDS:
        schema = JOB_REQUEST["properties"][spec_field.wire]
        assert schema["description"] == JOB_FIELDS[spec_field.wire] == spec_field.spec.help
    assert {f.setter for f in (s.spec for s in REQUEST_FIELDS)} <= {"user", "admin"}
    engine_set = {f.name for f in FIELDS if f.spec.setter == "engine"}
    assert engine_set == {"user", "array_id", "array_index", "array_max_running"}


def test_the_jobs_table_has_a_column_of_the_declared_type_for_each_stored_field():
    table = build_jobs_table(sa.MetaData())
    kinds = {"integer": sa.Integer, "double": sa.Double, "boolean": sa.Boolean, "json": sa.JSON}
    for spec_field in STORED:
        column, declared = table.c[spec_field.column_name], spec_field.spec.column
        assert column.nullable == declared.nullable, spec_field.name
        if declared.type.startswith("string:"):
            assert isinstance(column.type, sa.String) and column.type.length == int(
                declared.type[7:]
            )
        elif declared.type == "text":
            assert isinstance(column.type, sa.Text)
        else:
            assert isinstance(column.type, kinds[declared.type]), spec_field.name
    assert table.c["gpu_models"] is not None  # the request's gpu_model, stored as a list


def test_the_engines_job_and_the_services_extra_hold_the_specs_fields():
    request_block = [f.name for f in dataclasses.fields(Job)][: len(JOB_ATTRIBUTES) + 2]
    assert set(request_block) == {"id", "submit_time", *JOB_ATTRIBUTES}
    extra = {f.name for f in dataclasses.fields(Extra)}
    assert {f.name for f in STORED if not f.spec.on_job} <= extra


def test_a_job_view_and_its_schema_hold_the_specs_viewed_fields():
    spec = parse_job_request({"gpus": 2, "command": "train", "gpu_model": ["A100"], "cpus": 4})
    spec = dataclasses.replace(spec, queue="research", tier=2, user="alice")
    job = Job.from_spec(spec, "j-000001", 1.0)
    row = {**row_for(job, Extra.from_spec(1, spec)), "end_time": None}
    theirs, mine = public_job(row, mine=False, full=False), public_job(row, mine=True, full=True)
    assert set(PUBLIC_VIEW) <= set(theirs) and not set(OWNER_VIEW) & set(theirs)
    assert set(OWNER_VIEW) <= set(mine) and "labels" not in mine  # labels: not viewed
    assert mine["gpu_models"] == ["A100"] and mine["cpus"] == 4 and mine["user"] == "alice"
    assert set(mine) <= set(JOB["properties"]) and set(theirs) <= set(JOB["properties"])
    assert set(PUBLIC_VIEW) <= set(JOB["required"])
    again, extra = job_from_row(row)
    assert [getattr(again, n) for n in JOB_ATTRIBUTES] == [getattr(job, n) for n in JOB_ATTRIBUTES]
    assert extra.command == "train"


def test_the_trace_columns_are_the_specs_trace_fields(tmp_path):
    own = ("job_id", "submit_time", "duration")  # the trace's, not the job's
    assert (*own, *(f.wire for f in TRACE_FIELDS)) == REQUIRED + OPTIONAL
    trace = [
        TraceJob("a", 0.0, 10.0, 2, tier=1, queue="q", user="u", gpus_per_node=1, walltime=60.0),
        TraceJob("b", 5.0, 1.5, 1, kind="notebook", gpu_models=frozenset({"A100", "H100"})),
        TraceJob("c", 7.0, 3.0, 1, gpu_fraction=0.5),
        TraceJob("d", 9.0, 3.0, 0, cpus=2.0, memory_gb=8.0),
        TraceJob("e", 9.5, 3.0, 1, array_id="a-5", array_index=3, array_max_running=2),
    ]
    write_trace(tmp_path / "t.csv", trace)
    assert read_trace(tmp_path / "t.csv") == trace


# -- a field added to a spec shows up in each surface ------------------------------------------
def test_an_added_field_is_parsed_with_its_bounds_and_refused_by_the_spec_without_it():
    body = {"gpus": 1, "command": "train", "gpu_memory_gb": 40}
    assert parse_job_request(body, WiderSpec).gpu_memory_gb == 40.0
    assert parse_job_request({"gpus": 1, "command": "x"}, WiderSpec).gpu_memory_gb is None
    assert [f.wire for f in request_fields(WiderSpec)][-1] == "gpu_memory_gb"
    with pytest.raises(RequestError) as bad:
        parse_job_request({**body, "gpu_memory_gb": 4000}, WiderSpec)
    assert bad.value.field == "gpu_memory_gb"
    assert bad.value.message == "'gpu_memory_gb' must be a number from 0 to 1000, got 4000"
    with pytest.raises(RequestError) as unknown:
        parse_job_request(body)
    assert unknown.value.message.startswith("unknown field 'gpu_memory_gb'; known fields: gpus,")
    assert "gpu_memory_gb" not in unknown.value.message.partition("known fields")[2]


def test_an_added_field_is_in_the_openapi_schemas_records_and_trace_columns():
    fields = [f for f in WIDER if f.spec.help is not None]
    schema = job_request_schema(fields)["properties"]["gpu_memory_gb"]
    assert schema == {
        "type": ["number", "null"],
        "minimum": 0,
        "maximum": 1000.0,
        "description": "GPU memory on each GPU in GB (number from 0 to 1000)",
    }
    assert "gpu_memory_gb" not in JOB_REQUEST["properties"]
    assert view_fields("public", WIDER)["gpu_memory_gb"]["type"] == ["number", "null"]
    assert "gpu_memory_gb" in view_columns("public", WIDER)
    assert "gpu_memory_gb" not in PUBLIC_VIEW
    assert trace_columns([f for f in WIDER if f.spec.trace])[1][-1] == "gpu_memory_gb"
    assert "gpu_memory_gb" not in OPTIONAL


def test_an_added_field_is_a_column_that_calls_for_a_migration(sqlite_url):
    [column] = [c for c in spec_columns(WIDER) if c.name == "gpu_memory_gb"]
    assert isinstance(column.type, sa.Double) and column.nullable
    Store(sqlite_url).close()  # the database at the alembic head
    engine = sa.create_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            today = sa.MetaData()
            build_jobs_table(today)
            wider = sa.MetaData()
            build_jobs_table(wider, WIDER)
            context.opts["include_object"] = lambda o, name, kind, *_: (
                kind != "table" or name == "jobs"
            )
            assert compare_metadata(context, today) == []
            changes = compare_metadata(context, wider)
    finally:
        engine.dispose()
    assert [(c[0], c[2], c[3].name) for c in changes] == [("add_column", "jobs", "gpu_memory_gb")]


# -- the hub's and the kernel's bodies use the spec's names -----------------------------------
def test_the_spawners_job_request_asks_only_for_spec_fields():
    from jupyter_gpusched.hub.spawner import GPUSchedSpawner

    class User:
        name, groups = "carol", ()

    profiles = [
        {"display_name": "CPU", "slug": "cpu", "gpus": 0, "cpus": 2, "memory_gb": 4},
        {"display_name": "GPU", "slug": "gpu", "gpus": 1, "max_lifetime": "8h"},
    ]
    for slug in ("cpu", "gpu"):
        spawner = GPUSchedSpawner(user=User(), profiles=profiles)
        spawner.choose_profile({"profile": slug, "gpu_model": "A100"})
        body = spawner.job_request()
        assert set(body) <= set(JOB_FIELDS), set(body) - set(JOB_FIELDS)
        parse_job_request(body)  # and the service reads it
