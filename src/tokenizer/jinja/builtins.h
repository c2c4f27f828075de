#pragma once
// The filters, tests, global functions and methods of dschat's Jinja subset, with jinja2's and
// Python's results (and transformers' tojson and raise_exception). Errors are
// core::InvalidArgument without a position; the evaluator adds where the call is.
// Private to src/tokenizer/jinja.
//
//   filters   abs capitalize count d default first float int items join last length list lower
//             map reject rejectattr replace reverse safe select selectattr string title tojson
//             trim upper
//   tests     defined undefined none string mapping iterable sequence number integer float
//             boolean true false callable eq equalto == ne != lt lessthan < le <= gt greaterthan >
//             ge >= in odd even divisibleby lower upper sameas
//   globals   raise_exception namespace range dict strftime_now
//   methods   str: startswith endswith split rsplit strip lstrip rstrip upper lower replace title
//             capitalize find count; dict: items keys values get

#include <initializer_list>
#include <string>

#include "tokenizer/jinja/value.h"

namespace dschat {
namespace tokenizer {
namespace jinja {

bool is_filter(const std::string& name);
bool is_test(const std::string& name);
bool is_global_function(const std::string& name);
bool is_method(const std::string& name);

Value apply_filter(const std::string& name, const Value& operand, const Args& args);
bool apply_test(const std::string& name, const Value& operand, const Args& args);
/// The global function `name` (a callable), or undefined.
Value global_function(const std::string& name);
/// `object.name` as a bound method, or undefined when `object` has no such method.
Value method(const Value& object, const std::string& name);

/// The items a for loop (or a filter) visits: a list's items, a dict's keys, a string's
/// characters, nothing for undefined. Throws core::InvalidArgument for anything else.
List iterate(const Value& value);
/// Python's len() (undefined: 0).
int64_t length(const Value& value);
/// `object[key]` or `object.key` as jinja2's getitem/getattr: undefined when missing.
Value get_item(const Value& object, const Value& key);
Value get_attribute(const Value& object, const std::string& name);
/// Python's ordering of two values (numbers, strings, lists): <0, 0 or >0. Throws
/// core::InvalidArgument naming `op` for values Python cannot order.
int compare(const Value& a, const Value& b, const std::string& op);
/// Python's `item in container` (substring, list member, dict key).
bool contains(const Value& container, const Value& item);

/// A call's arguments by position or keyword (nullptr: not given). check_args throws
/// core::InvalidArgument naming `function` for too many positional or unknown keyword arguments.
const Value* arg(const Args& args, size_t index, const char* name);
void check_args(const Args& args, const std::string& function, std::initializer_list<const char*> names);

}  // namespace jinja
}  // namespace tokenizer
}  // namespace dschat
