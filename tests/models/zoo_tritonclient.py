"""Triton's own tritonclient asking a running numaserve for the zoo's
outputs (tests/models/test_zoo.py, through benchmarks/models/zoo_check.py).

  <build>/venv/triton/bin/python tests/models/zoo_tritonclient.py \\
      --grpc 127.0.0.1:PORT --http 127.0.0.1:PORT --manifest requests.json

Runs in the environment <build>/venv/triton (requirements/triton.txt), not
the zoo's: tritonclient's generated protos and numaserve_client's would
clash in one process. The manifest lists {"model", "inputs", "outputs"}:
each request's inputs (an .npz), sent once with tritonclient.grpc and once
with tritonclient.http (binary tensors), every output asked for; the
answers go to OUTPUTS with the suffix .grpc.npz and .http.npz.
"""
import argparse
import json
import sys

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype


def ask(module, client, model, arrays):
    inputs = []
    for name, array in arrays.items():
        tensor = module.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        if module is httpclient:
            tensor.set_data_from_numpy(array, binary_data=True)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    metadata = client.get_model_metadata(model)
    names = ([o["name"] for o in metadata["outputs"]] if module is httpclient
             else [o.name for o in metadata.outputs])
    outputs = [module.InferRequestedOutput(n, binary_data=True) if module is httpclient
               else module.InferRequestedOutput(n) for n in names]
    result = client.infer(model, inputs, outputs=outputs)
    return {n: result.as_numpy(n) for n in names}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grpc", required=True, help="HOST:PORT of numaserve's gRPC")
    parser.add_argument("--http", required=True, help="HOST:PORT of numaserve's HTTP")
    parser.add_argument("--manifest", required=True)
    args = parser.parse_args()
    with open(args.manifest) as f:
        requests = json.load(f)
    clients = {"grpc": (grpcclient, grpcclient.InferenceServerClient(args.grpc)),
               "http": (httpclient, httpclient.InferenceServerClient(args.http))}
    for request in requests:
        arrays = dict(np.load(request["inputs"]))
        for protocol, (module, client) in clients.items():
            np.savez(request["outputs"] + "." + protocol + ".npz",
                     **ask(module, client, request["model"], arrays))
    for _, client in clients.values():
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
