# ThreadSanitizer over Debian's Abseil (LLM_SANITIZE=thread, `make test-tsan`): Debian builds
# Abseil without TSan, so the sanitizer cannot see an absl::Mutex lock or unlock.
# tests/sanitizers/absl_mutex_tsan.cc defines Abseil's synchronization entry points, calling
# the library's and telling the sanitizer what they did; it is linked into every executable,
# which exports it (-rdynamic) so that gRPC's and Abseil's own calls reach it too.
function(llm_link_into_executables dir library)
  get_property(targets DIRECTORY ${dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(t ${targets})
    get_target_property(type ${t} TYPE)
    if(type STREQUAL "EXECUTABLE")
      target_link_libraries(${t} PRIVATE ${library})
    endif()
  endforeach()
  get_property(subdirs DIRECTORY ${dir} PROPERTY SUBDIRECTORIES)
  foreach(d ${subdirs})
    llm_link_into_executables(${d} ${library})
  endforeach()
endfunction()

function(llm_add_absl_tsan_annotations)
  add_library(llm_absl_tsan OBJECT ${PROJECT_SOURCE_DIR}/tests/sanitizers/absl_mutex_tsan.cc)
  target_link_libraries(llm_absl_tsan PUBLIC absl::synchronization absl::status absl::time
                        ${CMAKE_DL_LIBS})
  target_link_options(llm_absl_tsan INTERFACE -rdynamic)
  add_subdirectory(${PROJECT_SOURCE_DIR}/tests/sanitizers ${PROJECT_BINARY_DIR}/tests/sanitizers)
  llm_link_into_executables(${PROJECT_SOURCE_DIR} llm_absl_tsan)
endfunction()
