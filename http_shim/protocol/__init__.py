"""The shim's protocol layer: typed request models (pydantic v2), one declaration per API from which both
the validation and GET /openapi.json come, and the shared field groups and builders that turn validated
requests into engine protobuf. Each API keeps its models in its own package (openai/protocol.py, ...).

- base.py: `ApiModel`, the strict scalar types (int_in ranges taking 2.0 as 2 and refusing bools and
  strings, finite numbers, strings, booleans), unions whose failures keep their place (`by_type`,
  `text_or`), `Cap`, and `parse`, which raises today's 400 APIError.
- sampling.py, chat.py: the field groups and pieces the generation APIs share, and their builders.
- openapi.py: the document, assembled from each API's `ApiPart`.

Design choices:
- Operator limits (RequestLimits: max_n, max_tokens, ...) are runtime settings, so models do not hold
  them: a field carries a `Cap("max_n")` marker; `parse(model, body, limits=...)` hands the limits to
  validation through pydantic's context, where the marker checks them, and the generator writes them
  into the document as the marker's keyword (maximum, maxItems). One declaration, both uses, no model
  built per setting.
- Error messages are today's, not pydantic's: every scalar type checks its value itself and raises a
  message template with `{param}` in it (e.g. "'{param}' must be an integer, got {got}."); `parse`
  takes the first error (field order), builds the OpenAI `param` path from its location
  ("messages[0].content"), and fills the template in. pydantic's own structural errors (missing,
  object or array expected, too short) map to templates in base.py. Checks across fields are model
  validators failing with `fail(template, field=...)`, which names the field below the object.
- A null field is the field left out (ApiModel drops null keys before validation), as every API
  treated it before; unknown fields are ignored.
"""
