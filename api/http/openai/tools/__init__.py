"""Tools for Chat and Responses: what the client declared, what the model is shown, and how
its output is read back as tool calls. One module per job:

- spec.py: the tool-call format and `Tool` / `ToolSet` (the declared tools and tool_choice);
- validate.py: `build_toolset`, checking what a client declared (either API's shapes), once
  per request, in the endpoint's params.py;
- prompt.py: putting tools and tool-call history into the prompt;
- grammar.py: `tool_guide`, the grammar that forces the format;
- parser.py: `ToolCallParser`, reading calls out of generated text incrementally;
- output.py: `OutputParser`, the one parser of a generation every surface reads (thinking,
  then the answer's text and calls, in one event vocabulary).
Each endpoint writes the events in its own shapes: chat/tool_calls.py (`ChatDeltas`) and
responses/view.py (its typed events). The format itself, what a forced call prefills and how a
call that names no callable tool is read: spec.py's comment.
"""
