"""The shim's protocol layer: typed request models (pydantic v2), one declaration per API from which both
validation and GET /openapi.json come, and the field groups and builders the APIs share.

- base.py: `ApiModel`, the strict scalar types, `Cap` (an operator limit, checked against the limits
  `parse` hands to validation and written into the document) and `parse` (the first failure as a 400).
- sampling.py, chat.py: the field groups and pieces the generation APIs share, and their builders.
- openapi.py: `ApiPart`, what each API declares its share of GET /openapi.json with (assembled into the
  document in http_shim/openapi_document.py, which imports every API: nothing here imports an API).
- logprobs.py: token logprobs in OpenAI's shape, which chat completions and the Responses API share.

Messages are the shim's own, not pydantic's: each check raises a template with `{param}` in it (pydantic's
strict types get theirs from a table), filled in with the failure's OpenAI `param` path ("messages[0].content").
A null field is the field left out.
"""
