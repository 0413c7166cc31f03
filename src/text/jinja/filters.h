// Internal to the filters: helpers they share, and the text filters (filters_text.cpp) that the
// filter table in filters.cpp lists.
#pragma once

#include <string>

#include "text/jinja/renderer.h"
#include "text/jinja/value.h"

namespace kiln::jinja::filters {

// str(v) unless v is already a string (jinja2's soft_str keeps Markup).
Value soft_str(Renderer& r, const Value& v);
// A one-shot iterator over items, as jinja2's generator-returning filters give; or a lazy one that
// runs `next` as it is consumed (`source` is what it reads, for bookkeeping).
Value generator(List items, std::string type = "generator");
Value generator(Iterator::Next next, const Value& source);
// Python's iteration of `value` from inside a generator: pulled item by item.
Iterator::Next lazy_items(const Value& value);
// jinja2's make_attrgetter: a dotted path ("a.b.0"), each part looked up with getitem; digit
// parts are integers. `fallback` replaces undefined steps; `lowercase` is ignore_case.
Value attribute_path(Renderer& r, Value item, const Value& attribute, const Value* fallback, bool lowercase);

Value filter_capitalize(Renderer& r, const Value& v, CallArgs& args);
Value filter_center(Renderer& r, const Value& v, CallArgs& args);
Value filter_escape(Renderer& r, const Value& v, CallArgs& args);
Value filter_forceescape(Renderer& r, const Value& v, CallArgs& args);
Value filter_format(Renderer& r, const Value& v, CallArgs& args);
Value filter_indent(Renderer& r, const Value& v, CallArgs& args);
Value filter_lower(Renderer& r, const Value& v, CallArgs& args);
Value filter_upper(Renderer& r, const Value& v, CallArgs& args);
Value filter_replace(Renderer& r, const Value& v, CallArgs& args);
Value filter_safe(Renderer& r, const Value& v, CallArgs& args);
Value filter_string(Renderer& r, const Value& v, CallArgs& args);
Value filter_striptags(Renderer& r, const Value& v, CallArgs& args);
Value filter_title(Renderer& r, const Value& v, CallArgs& args);
Value filter_tojson(Renderer& r, const Value& v, CallArgs& args);
Value filter_trim(Renderer& r, const Value& v, CallArgs& args);
Value filter_truncate(Renderer& r, const Value& v, CallArgs& args);
Value filter_wordcount(Renderer& r, const Value& v, CallArgs& args);

}  // namespace kiln::jinja::filters
