#!/usr/bin/python3
"""gRPC health check of a numaserve server (the image's HEALTHCHECK).

Calls grpc.health.v1.Health/Check and exits 0 when the answer is SERVING
(numaserve answers SERVING while a worker is ready and it is not draining),
1 otherwise. Needs only python3-grpcio: the two messages are encoded here.

  healthcheck.py [--address HOST:PORT] [--service NAME] [--timeout S]

The address defaults to 127.0.0.1:$NUMASERVE_GRPC_PORT (8001). With TLS on
the gRPC port, NUMASERVE_HEALTH_CA names the CA file to trust (and
NUMASERVE_HEALTH_CERT / NUMASERVE_HEALTH_KEY a client certificate for mTLS).
"""

import argparse
import os
import sys

import grpc

SERVING = 1
STATUS_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def _varint(value):
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_request(service):
    """HealthCheckRequest { string service = 1; }"""
    data = service.encode("utf-8")
    return b"\x0a" + _varint(len(data)) + data if data else b""


def decode_status(data):
    """HealthCheckResponse { ServingStatus status = 1; } -> the status number."""
    i, status = 0, 0
    while i < len(data):
        key, i = _read_varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _read_varint(data, i)
            if field == 1:
                status = value
        elif wire == 2:
            length, i = _read_varint(data, i)
            i += length
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise ValueError("malformed HealthCheckResponse")
    return status


def _read_varint(data, i):
    shift, value = 0, 0
    while True:
        if i >= len(data):
            raise ValueError("truncated HealthCheckResponse")
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
        shift += 7


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def channel_to(address):
    ca = os.environ.get("NUMASERVE_HEALTH_CA")
    if not ca:
        return grpc.insecure_channel(address)
    cert = os.environ.get("NUMASERVE_HEALTH_CERT")
    key = os.environ.get("NUMASERVE_HEALTH_KEY")
    credentials = grpc.ssl_channel_credentials(
        root_certificates=_read(ca),
        private_key=_read(key) if key else None,
        certificate_chain=_read(cert) if cert else None)
    return grpc.secure_channel(address, credentials)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address",
                        default="127.0.0.1:%s" % os.environ.get("NUMASERVE_GRPC_PORT", "8001"))
    parser.add_argument("--service", default="",
                        help="service name to ask about ('' = the server as a whole)")
    parser.add_argument("--timeout", type=float, default=3.0)
    args = parser.parse_args()
    with channel_to(args.address) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            answer = check(encode_request(args.service), timeout=args.timeout)
        except grpc.RpcError as e:
            print("numaserve health %s: %s %s" % (args.address, e.code().name, e.details()),
                  file=sys.stderr)
            return 1
    status = decode_status(answer)
    name = STATUS_NAMES.get(status, str(status))
    print("numaserve health %s: %s" % (args.address, name))
    return 0 if status == SERVING else 1


if __name__ == "__main__":
    sys.exit(main())
