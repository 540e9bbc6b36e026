"""The gRPC API: Hugging Face TEI's ``tei.v1`` services over Blitz's ingress services."""
