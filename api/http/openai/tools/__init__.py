"""Tools for Chat and Responses: what the client declared, what the model is shown, and how
its output is read back as tool calls. One module per job:

- spec.py: the tool-call format and `Tool` / `ToolSet` (the declared tools and tool_choice);
- validate.py: `build_toolset`, checking what a client declared (either API's shapes), once
  per request, in the endpoint's params.py;
- prompt.py: putting tools and tool-call history into the prompt;
- grammar.py: `tool_guide`, the grammar that forces the format;
- parser.py: `ToolCallParser`, reading calls out of generated text incrementally.
Each endpoint writes the calls in its own shapes: chat/tool_calls.py (`ChatDeltas`) and
responses/events.py (output items).

The format the model writes (and is forced to write when a call is required or named):

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

for a function: the Hermes format that tool-capable chat templates (Qwen, Hermes, SmolLM3...)
teach. A custom tool's input is plain text, never JSON, so it has a form of its own:

    <tool_call name="apply_patch">
    *** Begin Patch ...
    </tool_call>

Several calls are separated by a newline. JSON is shown and forced with `json.dumps`'s ", " and
": " separators and no other whitespace (`runtime.grammar_spec.JSON_OPTIONS`): the history's
arguments are re-serialized that way, so the model never sees a layout it may not write.

When a call is forced (tool_choice `required` or a named tool), the opening that leaves no
choice is not generated: for one tool, its opening up to `"arguments":` (a custom tool's
header line); for several function tools, `<tool_call>\n{"name": "`; nothing when function
and custom tools are mixed (grammar.py `forced_prefix`). It is the grammar's `Guide.prefix`:
the tokenizer actor writes it after the assistant's generation prompt, the grammar starts
after it, and the parser reads it first, so the client sees the same calls, whole and
streamed. Usage counts it in prompt_tokens (it was prefilled); completion_tokens counts only
the generated tokens, and logprobs cover only those. A forced call so generates only what is
left to choose: its arguments (or input) and the closing tag.

A call names a tool the model may call now, or it is not a call: `<tool_call>` text that names
an undeclared (or, under tool_choice, disallowed) tool is left in the output as plain text,
never turned into a function_call the client would try to dispatch. The grammar makes such text
impossible while enforcement holds; this is the fallback when it does not.

When the chat template takes `tools` (`apply_chat_template(..., tools=...)`), function tools go
to it; otherwise, and for custom tools always, a system-prompt block (`tools_block`) describes
the tools and this format.
Tool results go back to the model as `tool` messages (template) or as
`<tool_response>...</tool_response>` blocks in a user message (fallback).
"""
