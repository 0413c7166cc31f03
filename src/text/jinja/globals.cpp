// Globals of transformers' environment: jinja2's range (capped by the sandbox), dict, namespace,
// cycler and joiner, and transformers' raise_exception and strftime_now.
#include <ctime>

#include "text/jinja/arguments.h"
#include "text/jinja/builtins.h"
#include "text/jinja/renderer.h"

namespace kiln::jinja {

namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

Value global_range(Renderer& r, CallArgs& args) {
  if (!args.keyword.empty()) type_error("range() takes no keyword arguments");
  size_t n = args.positional.size();
  if (n < 1 || n > 3) type_error("range expected at most 3 arguments, got {}", n);
  int64_t start = 0, stop, step = 1;
  if (n == 1) {
    stop = integer_argument("range", args.positional[0]);
  } else {
    start = integer_argument("range", args.positional[0]);
    stop = integer_argument("range", args.positional[1]);
    if (n == 3) step = integer_argument("range", args.positional[2]);
  }
  if (step == 0) fail(FailureKind::runtime, "range() arg 3 must not be zero");
  __int128 count = 0;
  if (step > 0 && start < stop) count = ((__int128)stop - start - 1) / step + 1;
  if (step < 0 && start > stop) count = ((__int128)start - stop - 1) / -(__int128)step + 1;
  if (count > kMaxRange)
    fail(FailureKind::runtime, "Range too big. The sandbox blocks ranges larger than MAX_RANGE ({}).", kMaxRange);
  List items;
  items.reserve(size_t(count));
  for (__int128 i = 0; i < count; ++i) items.push_back(Value::integer(int64_t(start + i * step)));
  (void)r;
  return Value::list(std::move(items));
}

// dict(*args, **kwargs): at most one mapping or iterable of pairs, then keyword arguments.
Dict dict_from_arguments(std::string_view function, const CallArgs& args) {
  if (args.positional.size() > 1)
    type_error("{} expected at most 1 argument, got {}", function, args.positional.size());
  Dict dict;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_undefined()) fail_undefined(source);  // Python asks it for .keys first
    if (source.is_dict()) {
      dict = source.as_dict();
    } else {
      size_t index = 0;
      for (const Value& pair : iterate(source)) {
        if (!pair.is_string() && !pair.is_sequence() && !pair.is_dict())
          type_error("cannot convert dictionary update sequence element #{} to a sequence", index);
        List items = iterate(pair);
        if (items.size() != 2)
          fail(FailureKind::runtime, "dictionary update sequence element #{} has length {}; 2 is required", index,
               items.size());
        if (!is_hashable(items[0])) type_error("unhashable type: '{}'", type_name(items[0]));
        dict.set(items[0], items[1]);
        ++index;
      }
    }
  }
  for (const auto& [name, value] : args.keyword) dict.set(Value::string(name), value);
  return dict;
}

Value global_dict(Renderer&, CallArgs& args) {
  return Value::dict(dict_from_arguments("dict", args));
}

Value global_namespace(Renderer& r, CallArgs& args) {
  auto ns = std::make_shared<Namespace>(dict_from_arguments("namespace", args));
  r.track(ns);
  return Value::object(ns);
}

// jinja2.utils.Cycler.
class Cycler : public Object {
 public:
  explicit Cycler(List items) : items_(std::move(items)) {}
  std::string type_name() const override { return "Cycler"; }
  Value get_attribute(std::string_view name) override {
    if (name == "current") return items_[position_];
    if (name == "items") return Value::tuple(items_);
    if (name == "next") {
      Cycler* self = this;
      return Value::object(std::make_shared<Builtin>(
          "next",
          [self](Renderer&, CallArgs& args) {
            bind_arguments("next", args, {});
            Value current = self->items_[self->position_];
            self->position_ = (self->position_ + 1) % self->items_.size();
            return current;
          },
          "<bound method Cycler.next>"));
    }
    if (name == "reset") {
      Cycler* self = this;
      return Value::object(std::make_shared<Builtin>(
          "reset",
          [self](Renderer&, CallArgs& args) {
            bind_arguments("reset", args, {});
            self->position_ = 0;
            return Value::none();
          },
          "<bound method Cycler.reset>"));
    }
    return Object::get_attribute(name);
  }

 private:
  List items_;
  size_t position_ = 0;
};

Value global_cycler(Renderer&, CallArgs& args) {
  if (!args.keyword.empty()) type_error("cycler() takes no keyword arguments");
  if (args.positional.empty()) fail(FailureKind::runtime, "at least one item has to be provided");
  return Value::object(std::make_shared<Cycler>(args.positional));
}

// jinja2.utils.Joiner: returns "" the first time it is called, the separator afterwards.
class Joiner : public Object {
 public:
  explicit Joiner(std::string separator) : separator_(std::move(separator)) {}
  std::string type_name() const override { return "Joiner"; }
  bool is_callable() const override { return true; }
  Value call(Renderer&, CallArgs& args) override {
    bind_arguments("joiner", args, {});
    if (!used_) {
      used_ = true;
      return Value::string("");
    }
    return Value::string(separator_);
  }

 private:
  std::string separator_;
  bool used_ = false;
};

Value global_joiner(Renderer&, CallArgs& args) {
  auto a = bind_arguments("joiner", args, {{"sep", Value::string(", ")}});
  return Value::object(std::make_shared<Joiner>(to_str(a[0])));
}

// transformers: raise jinja2.exceptions.TemplateError(message).
Value global_raise_exception(Renderer&, CallArgs& args) {
  auto a = bind_arguments("raise_exception", args, {{"message", {}}});
  throw TemplateException(FailureKind::raised, to_str(a[0]));
}

// transformers: datetime.now().strftime(format). datetime handles %f, %z and %Z itself (the last
// two are empty for its naive local time); the C library does the rest, as CPython's does.
Value global_strftime_now(Renderer& r, CallArgs& args) {
  auto a = bind_arguments("strftime_now", args, {{"format", {}}});
  if (!a[0].is_string()) type_error("strftime() argument 1 must be str, not {}", type_name(a[0]));
  const std::string& format = a[0].as_string();
  auto now = r.now();
  std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  if (micros < 0) micros += 1000000;
  std::tm local{};
  localtime_r(&seconds, &local);
  std::string c_format;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] == '%' && i + 1 < format.size()) {
      char c = format[++i];
      if (c == 'f') {
        c_format += fmt::format("{:06d}", micros);
      } else if (c != 'z' && c != 'Z') {
        c_format += '%';
        c_format += c;
      }
    } else {
      c_format += format[i];
    }
  }
  r.check_string(c_format.size() * 16);
  std::string out(c_format.size() * 8 + 64, '\0');
  size_t written = std::strftime(out.data(), out.size(), c_format.c_str(), &local);
  out.resize(written);
  return Value::string(std::move(out));
}

struct GlobalEntry {
  std::string_view name;
  Value (*function)(Renderer&, CallArgs&);
};

constexpr GlobalEntry kGlobals[] = {
    {"range", global_range},
    {"dict", global_dict},
    {"namespace", global_namespace},
    {"cycler", global_cycler},
    {"joiner", global_joiner},
    {"raise_exception", global_raise_exception},
    {"strftime_now", global_strftime_now},
};

}  // namespace

Value find_global(std::string_view name) {
  for (const GlobalEntry& entry : kGlobals)
    if (entry.name == name)
      return Value::object(
          std::make_shared<Builtin>(std::string(name), entry.function, fmt::format("<built-in function {}>", name)));
  return Value();
}

}  // namespace kiln::jinja
