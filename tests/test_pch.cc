// The owner of the tests' precompiled header (tests/CMakeLists.txt): GoogleTest executables
// reuse the header it compiles. Built only for them; it runs no test.
