"""The gRPC API, Hugging Face TEI's ``tei.v1`` services over Blitz's ingress services:
``tei.proto`` and protoc's ``tei_pb2``, the table of methods and their registration
(``rpc_table``), each method as a call of the services (``convert``), keys, errors and
streams (``servicer``), and an ``EmbedStream``'s messages answered in groups
(``grouping``)."""
