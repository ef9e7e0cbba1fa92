"""Google's official Dataproc client (google-cloud-dataproc) against flexq,
on the client's default transport, gRPC, with only the endpoint changed.

Run by tests/it/grpc.rs. Over TLS the client trusts the test's CA through
GRPC_DEFAULT_SSL_ROOTS_FILE_PATH; with --plaintext it is handed an
insecure channel. Every step asserts; the script exits non-zero on the
first failure and prints what it saw.
"""

import argparse
import sys
import time
import uuid

import grpc
from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import dataproc_v1
from google.cloud.dataproc_v1.services.batch_controller.transports import (
    BatchControllerGrpcTransport,
)
from google.longrunning import operations_pb2
from google.oauth2.credentials import Credentials

L4 = {
    "spark.dataproc.driver.resource.accelerator.type": "l4",
    "spark.dataproc.driver.provisioning.allocationTimeout": "1800s",
    "spark.dataproc.executor.resource.accelerator.type": "l4",
    "spark.dataproc.executor.provisioning.allocationTimeout": "1800s",
    "spark.dataproc.executor.compute.tier": "premium",
    "spark.dataproc.executor.disk.tier": "premium",
}


def flex_batch(labels=None, **properties):
    props = dict(L4)
    props.update(properties)
    return dataproc_v1.Batch(
        pyspark_batch=dataproc_v1.PySparkBatch(main_python_file_uri="file:///jobs/etl.py"),
        runtime_config=dataproc_v1.RuntimeConfig(version="3.0", properties=props),
        labels=labels or {},
    )


def client_for(args, token):
    if args.plaintext:
        channel = grpc.insecure_channel(args.endpoint)
        return dataproc_v1.BatchControllerClient(
            transport=BatchControllerGrpcTransport(channel=channel)
        )
    credentials = Credentials(token=token) if token else AnonymousCredentials()
    return dataproc_v1.BatchControllerClient(
        credentials=credentials, client_options={"api_endpoint": args.endpoint}
    )


def expect(error_class, call, reason=None):
    try:
        call()
    except error_class as e:
        if reason is not None:
            assert e.reason == reason, f"{error_class.__name__}: reason {e.reason!r}, expected {reason!r}: {e}"
        print(f"ok: {error_class.__name__}: {e.message}")
        return e
    except exceptions.GoogleAPICallError as e:
        raise AssertionError(f"expected {error_class.__name__}, got {type(e).__name__}: {e}")
    raise AssertionError(f"expected {error_class.__name__}, the call succeeded")


def until(what, check, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--endpoint", required=True, help="HOST:PORT")
    ap.add_argument("--plaintext", action="store_true")
    ap.add_argument("--token", help="a submitter's token for --project")
    ap.add_argument("--other-token", help="a submitter's token for another project")
    ap.add_argument("--project", default="demo")
    ap.add_argument("--region", default="us-central1")
    args = ap.parse_args()

    client = client_for(args, args.token)
    # The client's own default: nothing here chose the transport.
    assert client.transport.kind == "grpc", client.transport.kind
    parent = f"projects/{args.project}/locations/{args.region}"
    run = uuid.uuid4().hex[:8]

    # Create, then the same requestId again: the first create's operation.
    batch_id = f"grpc-{run}-a"
    request_id = f"req-{run}"
    op = client.create_batch(request=dataproc_v1.CreateBatchRequest(
        parent=parent, batch=flex_batch(), batch_id=batch_id, request_id=request_id))
    name = f"{parent}/batches/{batch_id}"
    assert op.operation.name.startswith(f"projects/{args.project}/regions/{args.region}/operations/"), op.operation.name
    assert op.metadata.batch == name, op.metadata
    assert op.metadata.operation_type == dataproc_v1.BatchOperationMetadata.BatchOperationType.BATCH
    assert not op.done()
    again = client.create_batch(request=dataproc_v1.CreateBatchRequest(
        parent=parent, batch=flex_batch(), batch_id=f"grpc-{run}-z", request_id=request_id))
    assert again.operation.name == op.operation.name, (again.operation.name, op.operation.name)
    print("ok: create, and the same requestId answers the same operation")

    # Get: queued, and flexq's extension in the state message.
    batch = client.get_batch(name=name)
    assert batch.name == name and batch.state == dataproc_v1.Batch.State.PENDING, batch
    assert batch.runtime_config.properties["spark.dataproc.executor.resource.accelerator.type"] == "l4"
    assert "Queue position" in batch.state_message, batch.state_message
    assert batch.create_time.year >= 2026, batch.create_time
    print(f"ok: get: {batch.state.name}: {batch.state_message}")

    # List with a filter, one per page: every page token works.
    for suffix in ("b", "c"):
        client.create_batch(parent=parent, batch=flex_batch(labels={"run": run}), batch_id=f"grpc-{run}-{suffix}")
    request = dataproc_v1.ListBatchesRequest(parent=parent, page_size=1, filter=f'labels.run = "{run}"')
    pages = list(client.list_batches(request=request).pages)
    seen = [b.name for page in pages for b in page.batches]
    assert all(len(page.batches) == 1 for page in pages), [len(p.batches) for p in pages]
    assert sorted(seen) == [f"{parent}/batches/grpc-{run}-b", f"{parent}/batches/grpc-{run}-c"], seen
    print(f"ok: list with a filter and page size 1: {len(pages)} pages")

    # Airflow's DataprocHook creates and lists under projects/P/regions/R.
    airflow_parent = f"projects/{args.project}/regions/{args.region}"
    created = client.create_batch(request=dataproc_v1.CreateBatchRequest(
        parent=airflow_parent, batch=flex_batch(), batch_id=f"grpc-{run}-d"))
    assert created.metadata.batch == f"{parent}/batches/grpc-{run}-d", created.metadata
    assert any(b.name == created.metadata.batch for b in client.list_batches(parent=airflow_parent))
    print("ok: create and list under projects/P/regions/R, as Airflow's hook names them")

    # The operations mixin: get and list operations.
    got = client.get_operation(operations_pb2.GetOperationRequest(name=op.operation.name))
    assert got.name == op.operation.name and not got.done
    listed = client.list_operations(
        operations_pb2.ListOperationsRequest(name=f"projects/{args.project}/regions/{args.region}/operations")
    )
    assert op.operation.name in [o.name for o in listed.operations], listed
    print("ok: get_operation, list_operations")

    # Cancel through the operations client until CANCELLED.
    op.cancel()
    until("CANCELLED", lambda: client.get_batch(name=name).state == dataproc_v1.Batch.State.CANCELLED)
    until("the operation done", op.done)
    assert isinstance(op.exception(), exceptions.Cancelled), repr(op.exception())
    print("ok: cancel through the operations client: CANCELLED")

    # Errors: the same exception classes as over REST.
    expect(exceptions.AlreadyExists,
           lambda: client.create_batch(parent=parent, batch=flex_batch(), batch_id=f"grpc-{run}-b"))
    e = expect(exceptions.InvalidArgument,
               lambda: client.create_batch(parent=parent, batch=flex_batch(**{"spark.executor.cores": "6"})),
               reason="INVALID_BATCH")
    assert any("spark.executor.cores" in str(d) for d in e.details), e.details
    expect(exceptions.InvalidArgument, lambda: client.get_batch(name="projects/x/zones/y/batches/z"))
    expect(exceptions.ResourceExhausted,
           lambda: client.create_batch(parent=parent,
                                       batch=flex_batch(**{"spark.executor.instances": "30"})),
           reason="NEVER_FITS")
    expect(exceptions.FailedPrecondition, lambda: client.delete_batch(name=f"{parent}/batches/grpc-{run}-b"))

    # Delete, then NOT_FOUND.
    client.delete_batch(name=name)
    expect(exceptions.NotFound, lambda: client.get_batch(name=name), reason="NOT_FOUND")
    print("ok: delete, then NOT_FOUND")

    if args.token:
        expect(exceptions.Unauthenticated,
               lambda: client_for(args, "not-a-token").get_batch(name=f"{parent}/batches/grpc-{run}-b"))
        if args.other_token:
            expect(exceptions.PermissionDenied,
                   lambda: client_for(args, args.other_token).get_batch(name=f"{parent}/batches/grpc-{run}-b"),
                   reason="PERMISSION_DENIED")
    print("all steps passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
